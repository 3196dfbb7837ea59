--[[
  Decides whether one generation request may start now, and on which endpoint.

  Budget rule (DESIGN invariant 3): a request may start only while
    committedTokens + inFlight * expectedTokens < tokenBudget
  where expectedTokens is the size-biased mean completion length of the dataset's committed
  samples (see below), floored by a prior until enough samples are committed. Endpoint rule: at most `cap` leases per endpoint,
  summed over every worker process; a lease is a member of the endpoint's sorted set scored
  by its expiry, so a crashed worker's leases lapse by themselves.

  Input:
    KEYS[1] dataset stats hash     (fields outputTokens, outputTokensSq, records, tokenBudget)
    KEYS[2] dataset in-flight zset (member rid, score expiry ms)
    KEYS[3] dataset done set        (a sample committed meanwhile, e.g. by a worker that took
            over its batch, is not sent again)
    KEYS[4] the dataset queue's BullMQ meta hash: its field `paused` (set by `Queue.pause()`,
            which `tokenmill pause`, the dashboard and Bull Board all call) stops every new
            request of the dataset at once, across every worker
    KEYS[5..] endpoint lease zsets, in the caller's order of preference
    (the key count varies with the endpoints, so the caller passes it first)
    ARGV[1] rid
    ARGV[2] lease ttl (ms)
    ARGV[3] prior expected completion tokens
    ARGV[4] leases allowed per endpoint
    ARGV[5] commits needed before the running mean replaces the prior
    ARGV[6] 1 when the request goes out on probation (its sample was in flight when the
            server dropped every connection, twice): it then needs an endpoint with no other
            probation running, and holds that endpoint's probation key (`<lease key>:probation`)
            for ARGV[7] ms, during which no other request starts there. Optional (default 0).
    ARGV[7] probation length (ms)
    ARGV[8] sample id

  Output:
    >= 1  the 1-based index (into KEYS[5..]) of the endpoint whose lease was taken
    -1    every endpoint is at its lease cap: wait for a slot
    -2    the budget is met: send nothing more for this dataset
    -3    the budget is reserved by requests in flight: wait for them
    -4    the sample is already committed: send nothing
    -5    the dataset is paused: send nothing until it is resumed
]]
local statsKey = KEYS[1]
local inflightKey = KEYS[2]
local rid = ARGV[1]
local ttl = tonumber(ARGV[2])
local prior = tonumber(ARGV[3])
local cap = tonumber(ARGV[4])
local minCommits = tonumber(ARGV[5])
local probation = tonumber(ARGV[6] or '0') == 1
local probationMs = tonumber(ARGV[7] or '0')
local sampleId = ARGV[8]

if sampleId and redis.call('SISMEMBER', KEYS[3], sampleId) == 1 then
  return -4
end

if redis.call('HEXISTS', KEYS[4], 'paused') == 1 then
  return -5
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

redis.call('ZREMRANGEBYSCORE', inflightKey, '-inf', now)

local stats = redis.call('HMGET', statsKey, 'outputTokens', 'records', 'tokenBudget', 'outputTokensSq')
local committed = tonumber(stats[1]) or 0
local records = tonumber(stats[2]) or 0
local budget = tonumber(stats[3]) or -1
local sumSq = tonumber(stats[4]) or 0

if budget >= 0 then
  if committed >= budget then
    return -2
  end
  local inflight = redis.call('ZCARD', inflightKey)
  -- A request caught in flight is, on average, a long one (the inspection paradox: its
  -- expected length is the size-biased mean sum(L^2) / sum(L), not the plain mean). And short
  -- completions finish first, so few commits run low: until the commits outnumber the
  -- requests in flight (and reach minCommits), the prior is a floor.
  local expected = prior
  if records > 0 and committed > 0 then
    expected = sumSq / committed
    if records < minCommits or records < inflight then
      expected = math.max(expected, prior)
    end
  end
  if committed + inflight * expected >= budget then
    return -3
  end
end

local best = -1
local bestLoad = cap
for i = 5, #KEYS do
  local key = KEYS[i]
  -- An endpoint with a prompt on probation takes nothing else until the probation ends.
  if redis.call('EXISTS', key .. ':probation') == 0 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    local load = redis.call('ZCARD', key)
    if load < bestLoad then
      best = i
      bestLoad = load
    end
  end
end
if best < 0 then
  return -1
end

if probation then
  redis.call('SET', KEYS[best] .. ':probation', rid, 'PX', probationMs)
end
redis.call('ZADD', KEYS[best], now + ttl, rid)
redis.call('ZADD', inflightKey, now + ttl, rid)
return best - 4
