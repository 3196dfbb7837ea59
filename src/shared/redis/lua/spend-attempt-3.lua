--[[
  Spends one attempt of a sample against a healthy server and releases the request's
  leases, so the sample can be sent again (or failed once its attempts are spent).

  Input:
    KEYS[1] dataset attempts hash
    KEYS[2] dataset in-flight zset
    KEYS[3] endpoint lease zset
    ARGV[1] sample id
    ARGV[2] rid

  Output: the attempts spent so far, this one included
]]
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
return redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
