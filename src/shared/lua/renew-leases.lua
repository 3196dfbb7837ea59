--[[
  Extends the leases of requests still in flight, on the server's clock (so workers on
  machines with skewed clocks agree with acquire-request.lua). A lease that already lapsed
  is not brought back.

  Input (variable key count, passed first):
    KEYS[i]  a zset holding a lease (dataset in-flight zset or endpoint lease zset)
    ARGV[1]  lease ttl (ms)
    ARGV[i+1] the rid whose lease in KEYS[i] is extended

  Output: the number of leases extended
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = now + tonumber(ARGV[1])
local n = 0
for i = 1, #KEYS do
  n = n + redis.call('ZADD', KEYS[i], 'XX', 'CH', expiry, ARGV[i + 1])
end
return n
