--[[
  Takes over a process lock from a holder known to be gone, only if that holder still has it.

  Input:
    KEYS[1] lock key
    ARGV[1] the gone holder's token
    ARGV[2] the new holder's token
    ARGV[3] time to live (ms)

  Output: 1 taken over | 0 the lock changed meanwhile (nothing done)
]]
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
