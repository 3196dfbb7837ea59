--[[
  Decides whether one generation request may start now, and on which endpoint.

  Budget rule (docs/design.md, invariant 3): a request may start only while
    committedTokens + sum over the requests in flight of E[L | L > x_i] < tokenBudget
  where x_i is how far request i has come and E[L | L > x] its expected final length, from the
  log-bucketed histogram of the dataset's committed lengths (`<stats>:lengths`, fields
  c<bucket> and t<bucket>, bucket = floor(8 log2(L + 1)); written by commit-sample-9.lua;
  budget-expectation.ts is the reference of this arithmetic). A fresh request expects the plain
  mean. x_i is the larger of the tokens streamed so far (`<inflight>:progress`, rid -> tokens,
  reported by workers that stream) and the time since the request started
  (`<inflight>:start`, rid -> ms, written here) times the dataset's per-request decode rate
  (stats rateMax, the fastest recent request's tokens per ms, kept by the commit: a conservative
  speed, since lag only makes a request look slower; ARGV[11] scales it up where nothing is
  streamed). The distribution is the
  Kaplan-Meier estimate with the requests in flight as censored lengths (short completions
  finish first, so the commits alone lack the tail early on); the share still running past the
  last length seen counts as spread evenly up to max_new_tokens. While the commits are fewer
  than ARGV[5], every expectation is floored by the prior. Far from the budget (committed + in flight
  x max_new_tokens below it) nothing is summed. A dataset in `budget: strict` whose stop flag is
  set (stats budgetStopMs, by budget-progress-2.lua) starts nothing until its aborted requests
  are committed; the flag is dropped when nothing of it is in flight any more and the budget is
  still not met (their worker died before committing).

  Endpoint rule: at most `cap` leases per endpoint,
  summed over every worker process; a lease is a member of the endpoint's sorted set scored
  by its expiry, so a crashed worker's leases lapse by themselves.

  Input:
    KEYS[1] dataset stats hash     (fields outputTokens, records, tokenBudget, rateMax, budgetStopMs)
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
    ARGV[5] commits needed before the observed lengths replace the prior as a floor
    ARGV[6] 1 when the request goes out on probation (its sample was in flight when the
            server dropped every connection, twice): it then needs an endpoint with no other
            probation running, and holds that endpoint's probation key (`<lease key>:probation`)
            for ARGV[7] ms, during which no other request starts there.
    ARGV[7] probation length (ms)
    ARGV[8] sample id
    ARGV[9] max_new_tokens of the dataset's requests
    ARGV[10] standard deviations of the in-flight total added to the reservation (the dataset's
            `budgetMarginSd`): the sum of the requests' conditional variances Var[L | L > x_i], as if
            independent (while the commits are fewer than ARGV[5], each at least prior^2 / 3,
            the variance of a length spread evenly over [0, 2 prior]). Near the end of a dataset
            the last requests then start only while the budget is likely to hold them, and the
            ones started later, when less is uncertain, top it up. With nothing in flight the
            sum is empty, so a dataset below its budget always starts one request: it never
            stalls.
    ARGV[11] factor on the time-based progress of a request with no streamed progress (1 for a
            dataset whose progress is streamed). rateMax is each recent request's whole-life average (acquire to commit:
            queueing, prefill and the worker's lag included) at the batch size of its time, while
            the requests running at a dataset's end decode faster as the batch empties, so time x
            rateMax falls behind their progress; E[L | L > x] grows with x, so a progress taken
            too low under-reserves, and one taken too high only holds back more.

    ARGV[12], ARGV[13], ... further requests of the same dataset and endpoints, five arguments
            each: rid, prior expected completion tokens, probation (1 | 0), sample id,
            max_new_tokens (as ARGV[1], ARGV[3], ARGV[6], ARGV[8], ARGV[9]). One call then
            decides a group of requests in order, each as if it came alone after the ones
            before it (one script run instead of one per request).
    Every argument is required (the caller resolves each value once, from the config); a missing
    or non-numeric one is an error, never a silent default. A dataset without a budget has no
    `tokenBudget` field.

  Output (a number for one request; with further requests, a table of one number each):
    >= 1  the 1-based index (into KEYS[5..]) of the endpoint whose lease was taken
    -1    every endpoint is at its lease cap: wait for a slot
    -2    the budget is met: send nothing more for this dataset
    -3    the budget is reserved by requests in flight: wait for them
    -4    the sample is already committed: send nothing
    -5    the dataset is paused: send nothing until it is resumed
]]
local function number(i, what)
  local v = tonumber(ARGV[i])
  if v == nil then
    error('acquire-request.lua: ARGV[' .. i .. '] (' .. what .. ') is missing or not a number')
  end
  return v
end
local function text(i, what)
  if ARGV[i] == nil or ARGV[i] == '' then
    error('acquire-request.lua: ARGV[' .. i .. '] (' .. what .. ') is missing')
  end
  return ARGV[i]
end
if #ARGV < 11 or (#ARGV - 11) % 5 ~= 0 then
  error('acquire-request.lua: expected 11 arguments, then 5 per further request, got ' .. #ARGV)
end

local statsKey = KEYS[1]
local inflightKey = KEYS[2]
local ttl = number(2, 'lease ttl')
local cap = number(4, 'leases allowed per endpoint')
local minCommits = number(5, 'commits before the observed lengths')
local probationMs = number(7, 'probation length')
local marginSd = number(10, 'budget margin in standard deviations')
local timedFactor = number(11, 'factor on time-based progress')

-- The requests to decide: the first from ARGV[1..11], then five arguments each from ARGV[12].
local requests = { { text(1, 'rid'), number(3, 'prior'), number(6, 'probation') == 1, text(8, 'sample id'), number(9, 'max_new_tokens') } }
for i = 12, #ARGV, 5 do
  requests[#requests + 1] = {
    text(i, 'rid'), number(i + 1, 'prior'), number(i + 2, 'probation') == 1, text(i + 3, 'sample id'), number(i + 4, 'max_new_tokens'),
  }
end
local function answer(codes)
  if #ARGV <= 11 then return codes[1] end
  return codes
end

if redis.call('HEXISTS', KEYS[4], 'paused') == 1 then
  local codes = {}
  for i = 1, #requests do
    if redis.call('SISMEMBER', KEYS[3], requests[i][4]) == 1 then codes[i] = -4 else codes[i] = -5 end
  end
  return answer(codes)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local startKey = inflightKey .. ':start'
local progressKey = inflightKey .. ':progress'

-- Hashes get at most this many fields per call (Lua's unpack limit).
local function chunked(cmd, key, list)
  local out = {}
  for i = 1, #list, 1000 do
    local part = redis.call(cmd, key, unpack(list, i, math.min(#list, i + 999)))
    if type(part) == 'table' then
      for _, v in ipairs(part) do out[#out + 1] = v end
    end
  end
  return out
end

-- Requests whose lease lapsed (a crashed worker's) release their reservation and their progress.
local lapsed = redis.call('ZRANGEBYSCORE', inflightKey, '-inf', now)
if #lapsed > 0 then
  redis.call('ZREMRANGEBYSCORE', inflightKey, '-inf', now)
  chunked('HDEL', startKey, lapsed)
  chunked('HDEL', progressKey, lapsed)
end
-- Start times of requests that ended without a commit (failed, released) are swept now and then.
if redis.call('HLEN', startKey) > 2 * redis.call('ZCARD', inflightKey) + 256 then
  local stale = {}
  for _, r in ipairs(redis.call('HKEYS', startKey)) do
    if not redis.call('ZSCORE', inflightKey, r) then stale[#stale + 1] = r end
  end
  chunked('HDEL', startKey, stale)
  chunked('HDEL', progressKey, stale)
end

-- Decides one request (after the ones before it in this call).
local function acquire(rid, prior, probation, sampleId, maxNew)
  if redis.call('SISMEMBER', KEYS[3], sampleId) == 1 then
    return -4
  end
  local stats = redis.call('HMGET', statsKey, 'outputTokens', 'records', 'tokenBudget', 'rateMax', 'budgetStopMs')
  local committed = tonumber(stats[1]) or 0
  local records = tonumber(stats[2]) or 0
  local budget = tonumber(stats[3])
  local rate = tonumber(stats[4]) or 0

  if budget ~= nil then
    if committed >= budget then
      return -2
    end
    local inflight = redis.call('ZCARD', inflightKey)
    if stats[5] then
      if inflight > 0 then
        return -3
      end
      redis.call('HDEL', statsKey, 'budgetStopMs')
    end
    if committed + inflight * maxNew >= budget then
      local log2 = math.log(2)
      local function bucketOf(x)
        return math.floor(8 * math.log(x + 1) / log2)
      end
      -- How far each request in flight has come.
      local xs = {}
      if inflight > 0 then
        local rids = redis.call('ZRANGE', inflightKey, 0, -1)
        local starts = chunked('HMGET', startKey, rids)
        local streamed = {}
        if redis.call('EXISTS', progressKey) == 1 then streamed = chunked('HMGET', progressKey, rids) end
        for i = 1, #rids do
          local x = tonumber(streamed[i])
          local started = tonumber(starts[i])
          local timed = 0
          if started and rate > 0 then timed = (now - started) * rate end
          if x then x = math.max(x, timed) else x = timed * timedFactor end
          xs[i] = math.floor(math.min(x, maxNew - 1))
        end
      end
      -- The length distribution, Kaplan-Meier: committed lengths are events, the requests in
      -- flight censored at their progress (lengthModel() in budget-expectation.ts).
      local lengths = redis.call('HGETALL', statsKey .. ':lengths')
      local cnt, tok, cens, maxB = {}, {}, {}, -1
      local atRisk = 0
      for i = 1, #lengths, 2 do
        local f = lengths[i]
        local b = tonumber(string.sub(f, 2))
        local v = tonumber(lengths[i + 1])
        if string.sub(f, 1, 1) == 'c' then
          cnt[b] = v
          atRisk = atRisk + v
        else
          tok[b] = v
        end
        if b > maxB then maxB = b end
      end
      for i = 1, #xs do
        local b = bucketOf(xs[i])
        cens[b] = (cens[b] or 0) + 1
        atRisk = atRisk + 1
        if b > maxB then maxB = b end
      end
      local mass, mean = {}, {}
      local survival, lastEvent = 1, -1
      for b = 0, maxB do
        local d = cnt[b] or 0
        if d > 0 and atRisk > 0 then
          local m = survival * d / atRisk
          mass[b] = m
          mean[b] = (tok[b] or 0) / d
          survival = survival - m
          lastEvent = b
        end
        atRisk = atRisk - d - (cens[b] or 0)
      end
      local tailMass, tailFrom = 0, 0
      if lastEvent >= 0 then
        tailMass = math.max(0, survival)
        tailFrom = 2 ^ ((lastEvent + 1) / 8) - 1
      end
      -- Mass above each bucket, its tokens and their squares.
      local aboveMass, aboveTok, aboveSq = {}, {}, {}
      local am, at, aq = 0, 0, 0
      for b = maxB, 0, -1 do
        aboveMass[b] = am
        aboveTok[b] = at
        aboveSq[b] = aq
        if mass[b] then
          am = am + mass[b]
          at = at + mass[b] * mean[b]
          aq = aq + mass[b] * mean[b] * mean[b]
        end
      end
      local floor, varFloor = 0, 0
      if records < minCommits then
        floor = math.min(prior, maxNew)
        varFloor = floor * floor / 3
      end
      -- E[L | L > x] and Var[L | L > x], as conditionalMean() in budget-expectation.ts.
      local function expected(x)
        local bx = bucketOf(x)
        local n, s, q = 0, 0, 0
        if bx <= maxB then
          n = aboveMass[bx]
          s = aboveTok[bx]
          q = aboveSq[bx]
          if mass[bx] then
            local lo = 2 ^ (bx / 8) - 1
            local hi = 2 ^ ((bx + 1) / 8) - 1
            local part = mass[bx] * math.min(1, math.max(0, (hi - x) / (hi - lo)))
            local v = math.max(mean[bx], (x + hi) / 2)
            n = n + part
            s = s + part * v
            q = q + part * v * v
          end
        end
        if tailMass > 0 and maxNew > x then
          local a = math.max(x, tailFrom)
          n = n + tailMass
          s = s + tailMass * (a + maxNew) / 2
          q = q + tailMass * (a * a + a * maxNew + maxNew * maxNew) / 3
        end
        if n <= 1e-12 then
          return math.max(math.min(maxNew, 1.25 * (x + 1)), floor), varFloor
        end
        local m = s / n
        return math.max(math.min(maxNew, math.max(x, m)), floor), math.max(varFloor, q / n - m * m)
      end
      local total = committed
      local variance = 0
      local memoE, memoV = {}, {}
      for i = 1, #xs do
        local x = xs[i]
        local e = memoE[x]
        if not e then
          e, memoV[x] = expected(x)
          memoE[x] = e
        end
        total = total + e
        variance = variance + memoV[x]
        if total >= budget then
          return -3
        end
      end
      -- The margin (empty, so 0, when nothing is in flight: the progress rule above).
      if marginSd > 0 and total + marginSd * math.sqrt(variance) >= budget then
        return -3
      end
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
  redis.call('HSET', startKey, rid, now)
  return best - 4
end

local codes = {}
for i = 1, #requests do
  local r = requests[i]
  codes[i] = acquire(r[1], r[2], r[3], r[4], r[5])
end
return answer(codes)
