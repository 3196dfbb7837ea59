--[[
  Renews a process lock only if its holder still holds it (compare-and-set). A holder whose
  lock lapsed and was taken by another process must learn it here, never extend the other's.

  Input:
    KEYS[1] lock key
    ARGV[1] this holder's token (the lock's value)
    ARGV[2] time to live (ms)

  Output: 1 renewed | 0 the lock is no longer ours (lapsed, or held by another token)
]]
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
