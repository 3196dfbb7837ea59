--[[
  Restores commits that Redis lost but the sink had already written to disk (an OS crash
  with `appendfsync everysec` loses about the last second of writes). For each sample id
  not in the done set, does what its first commit did to the done set and the counters
  (commit-sample-9.lua), so the producer does not send it again and the counters equal the
  files. Ids already done are left alone.

  Input:
    KEYS[1] dataset done set
    KEYS[2] dataset stats hash
    KEYS[3] dataset failed hash
    KEYS[4] dataset skipped set
    KEYS[5] dataset attempts hash
    ARGV[1], ARGV[2], ... pairs: sample id, completion tokens of its line on disk

  Output: number of ids restored
]]
--- @include "count-output-tokens"
local restored = 0
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  local tokens = tonumber(ARGV[i + 1])
  if redis.call('SADD', KEYS[1], id) == 1 then
    restored = restored + 1
    countOutputTokens(KEYS[2], tokens, now)
    redis.call('HINCRBY', KEYS[2], 'records', 1)
    redis.call('HINCRBY', KEYS[2], 'outputTokensSq', tokens * tokens)
    redis.call('HSETNX', KEYS[2], 'firstCommitMs', now)
    redis.call('HDEL', KEYS[3], id)
    redis.call('SREM', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
  end
end
return restored
