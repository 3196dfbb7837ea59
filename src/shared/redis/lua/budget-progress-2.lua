--[[
  Records how far this worker's streamed requests of a `budget: strict` dataset have come, and
  says whether the dataset must stop: once the tokens committed plus the tokens already produced
  by every request in flight (over all workers, as each last reported them) reach the budget,
  the stop flag (stats budgetStopMs) is set, and every worker aborts what it has in flight for
  the dataset, committing the partial outputs. acquire-request.lua starts nothing while the flag
  is set and something is still in flight.

  Input:
    KEYS[1] dataset in-flight zset (rid -> lease expiry); its progress hash is `<KEYS[1]>:progress`
            (rid -> completion tokens streamed so far)
    KEYS[2] dataset stats hash     (outputTokens, tokenBudget; sets budgetStopMs and budgetStopTokens,
            the tokens committed and produced when the stop was decided)
    ARGV[2i-1], ARGV[2i]  a rid of this worker and its completion tokens so far

  Output:
    1  stop: abort the requests in flight of this dataset
    0  go on
]]
local inflightKey = KEYS[1]
local progressKey = inflightKey .. ':progress'
local statsKey = KEYS[2]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

for i = 1, #ARGV - 1, 2 do
  -- A request already committed or released keeps no progress behind it.
  local score = redis.call('ZSCORE', inflightKey, ARGV[i])
  if score and tonumber(score) > now then
    redis.call('HSET', progressKey, ARGV[i], ARGV[i + 1])
  end
end

local stats = redis.call('HMGET', statsKey, 'outputTokens', 'tokenBudget', 'budgetStopMs')
if stats[3] then
  return 1
end
local committed = tonumber(stats[1]) or 0
local budget = tonumber(stats[2])
if budget == nil then
  return 0
end

-- Only requests whose lease is live: a crashed worker's partial output is lost, not committed.
local live = redis.call('ZRANGEBYSCORE', inflightKey, '(' .. now, '+inf')
local produced = 0
for i = 1, #live, 1000 do
  local part = redis.call('HMGET', progressKey, unpack(live, i, math.min(#live, i + 999)))
  for _, v in ipairs(part) do
    produced = produced + (tonumber(v) or 0)
  end
end
if committed + produced >= budget then
  redis.call('HSET', statsKey, 'budgetStopMs', now, 'budgetStopTokens', committed + produced)
  return 1
end
return 0
