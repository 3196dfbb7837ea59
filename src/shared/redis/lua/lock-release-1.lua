--[[
  Releases a process lock only if this holder still holds it.

  Input:
    KEYS[1] lock key
    ARGV[1] this holder's token (the lock's value)

  Output: 1 released | 0 not ours (nothing changed)
]]
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
