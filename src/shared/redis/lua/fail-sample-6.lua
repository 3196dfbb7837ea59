--[[
  Records a sample as failed for a reason of its own (SGLang 400, attempts exhausted),
  unless it was committed meanwhile. Releases the request's leases either way.

  Input:
    KEYS[1] dataset done set
    KEYS[2] dataset failed hash       (sample id -> reason JSON)
    KEYS[3] dataset in-flight zset
    KEYS[4] endpoint lease zset       (may be the in-flight key again when no lease is held)
    KEYS[5] dataset attempts hash
    KEYS[6] dataset skipped set
    ARGV[1] sample id
    ARGV[2] reason (JSON)
    ARGV[3] rid

  Output: 1 recorded as failed | 0 already committed (nothing recorded)
]]
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HDEL', KEYS[5], ARGV[1])
redis.call('SREM', KEYS[6], ARGV[1])
return 1
