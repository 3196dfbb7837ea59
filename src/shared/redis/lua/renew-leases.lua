--[[
  Renews the leases of requests this process still has running, on the server's clock (so
  workers on machines with skewed clocks agree with acquire-request.lua).

  A lease that lapsed (the process or Redis stalled past the lease TTL and another process's
  acquire swept it) is taken again only while the endpoint is below its cap, so the
  per-endpoint cap holds after any stall. When the endpoint is full, the request has lost its
  slot: both its entries are removed and the caller aborts it and sends the sample again later.

  Input (variable key count, passed first; two keys per request):
    KEYS[2i-1] the dataset's in-flight zset (rid -> expiry), for the budget reservation
    KEYS[2i]   the endpoint's lease zset (rid -> expiry), capped at ARGV[2]
    ARGV[1]    lease ttl (ms)
    ARGV[2]    leases allowed per endpoint
    ARGV[i+2]  the rid of request i

  Output: one code per request, in order:
    1  renewed
    2  had lapsed; taken again (the endpoint had room)
    0  had lapsed and the endpoint is full: lost (abort it)
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = now + tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local out = {}
for i = 1, #KEYS / 2 do
  local inflightKey = KEYS[2 * i - 1]
  local leaseKey = KEYS[2 * i]
  local rid = ARGV[i + 2]
  local score = redis.call('ZSCORE', leaseKey, rid)
  if score and tonumber(score) > now then
    redis.call('ZADD', leaseKey, expiry, rid)
    redis.call('ZADD', inflightKey, expiry, rid)
    out[i] = 1
  else
    redis.call('ZREMRANGEBYSCORE', leaseKey, '-inf', now)
    if redis.call('ZCARD', leaseKey) < cap then
      redis.call('ZADD', leaseKey, expiry, rid)
      redis.call('ZADD', inflightKey, expiry, rid)
      out[i] = 2
    else
      redis.call('ZREM', leaseKey, rid)
      redis.call('ZREM', inflightKey, rid)
      out[i] = 0
    end
  end
end
return out
