--[[
  Marks a dataset completed, unless `retry-failed` gave failed samples back since the
  producer's pass began (their ids are in neither the done nor the failed set, so a new pass
  must send them).

  Input:
    KEYS[1] dataset stats hash        (status, completedReason, completedAtMs)
    KEYS[2] dataset producer hash     (retryGen)
    ARGV[1] the retryGen the producer read when its pass began ('' when it ignores it)
    ARGV[2] reason (budget | exhausted)

  Output: 1 completed | 0 a retry came in: make another pass
]]
if ARGV[1] ~= '' then
  local gen = redis.call('HGET', KEYS[2], 'retryGen') or '0'
  if gen ~= ARGV[1] then
    return 0
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'status', 'completed', 'completedReason', ARGV[2], 'completedAtMs', now)
return 1
