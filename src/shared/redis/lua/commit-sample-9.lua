--[[
  Commits a sample's result exactly once (docs/design.md, invariant 2), or a group of them.

  The first commit of a sample id records it as done, adds its completion tokens to the
  dataset's counter and appends the result to the dataset's results stream. Any later
  commit of the same id (a retried, stalled, re-delivered or duplicated job) changes
  nothing but releasing its own lease. BullMQ delivers at least once; this makes the
  effect exactly once.

  Input:
    KEYS[1] dataset done set          (sample ids)
    KEYS[2] dataset stats hash        (outputTokens, outputTokensSq, records, tokenBudget, budgetMetMs, firstCommitMs, lastCommitMs, rateMax;
                                      beside it `<KEYS[2]>:lengths`, the length histogram)
    KEYS[3] dataset results stream
    KEYS[4] dataset in-flight zset    (rid -> expiry; beside it `<KEYS[4]>:start` and `:progress`)
    KEYS[5] endpoint lease zset       (rid -> expiry)
    KEYS[6] dataset failed hash       (sample id -> reason JSON)
    KEYS[7] dataset skipped set       (sample ids skipped by budget)
    KEYS[8] dataset attempts hash     (sample id -> attempts spent)
    KEYS[9] dataset rate hash         (time bucket -> tokens committed in it)
    ARGV[1] sample id
    ARGV[2] completion tokens
    ARGV[3] result record (JSON)
    ARGV[4] rid
    ARGV[5] rate bucket width (ms)
    ARGV[6] rate buckets to keep
    ARGV[7], ARGV[8], ... further samples of the same dataset and endpoint, four arguments each
            as ARGV[1..4]: one call commits a group of results (one script run instead of one
            per result); each is committed exactly as if it came alone, in order

  A record of a turn of a conversation regenerated turn by turn (one with "conversation_id" and
  "turn") also keeps its output ids in the conversation's history, `<KEYS[1]>:conv:<conversation
  id>` (turn -> output ids as JSON), in the same step: a conversation resumes at its next turn
  with exactly the history its committed turns had (unless it has ended already:
  `<KEYS[1]>:conversations`, finish-conversation-4.lua). Its first turn counts the conversation as
  started (stats conversationsStarted); a later turn whose prompt was spliced from the previous
  turn's ids counts in turnsSpliced.

  Output: { committed (1 first commit | 0 duplicate), dataset output tokens after it } per
          sample, flat: { c1, t1, c2, t2, ... }
]]
--- @include "count-output-tokens"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local width = tonumber(ARGV[5])
local keep = tonumber(ARGV[6])
local bucket = math.floor(now / width)
local out = {}

local function commit(id, tokens, record, rid)
  redis.call('ZREM', KEYS[4], rid)
  redis.call('ZREM', KEYS[5], rid)
  -- The request's start time and streamed progress (acquire-request.lua's reservation).
  local started = redis.call('HGET', KEYS[4] .. ':start', rid)
  redis.call('HDEL', KEYS[4] .. ':start', rid)
  redis.call('HDEL', KEYS[4] .. ':progress', rid)

  if redis.call('SADD', KEYS[1], id) == 0 then
    out[#out + 1] = 0
    out[#out + 1] = tonumber(redis.call('HGET', KEYS[2], 'outputTokens') or '0')
    return
  end

  local total = countOutputTokens(KEYS[2], tokens, now)
  redis.call('HINCRBY', KEYS[2], 'records', 1)
  redis.call('HINCRBY', KEYS[2], 'outputTokensSq', tokens * tokens)
  -- The length histogram and the decode rate that acquire-request.lua reserves by.
  local lb = math.floor(8 * math.log(tokens + 1) / math.log(2))
  redis.call('HINCRBY', KEYS[2] .. ':lengths', 'c' .. lb, 1)
  redis.call('HINCRBY', KEYS[2] .. ':lengths', 't' .. lb, tokens)
  if started then
    -- The fastest recent request (tokens / time since its acquire; decays 1 % a commit): a lagging
    -- worker or a queued request only ever makes a request look slower, never faster.
    local r = tonumber(redis.call('HGET', KEYS[2], 'rateMax') or '0') or 0
    redis.call('HSET', KEYS[2], 'rateMax', math.max(tokens / math.max(1, now - tonumber(started)), 0.99 * r))
  end
  redis.call('HSETNX', KEYS[2], 'firstCommitMs', now)
  redis.call('HSET', KEYS[2], 'lastCommitMs', now)
  redis.call('XADD', KEYS[3], '*', 'r', record)
  if string.find(record, '"conversation_id":', 1, true) then
    local r = cjson.decode(record)
    -- A conversation another delivery has ended keeps no history (finish-conversation-4.lua
    -- deleted it): the turn is committed, nothing resumes after it.
    if r.conversation_id ~= nil and r.turn ~= nil then
      if redis.call('HEXISTS', KEYS[1] .. ':conversations', r.conversation_id) == 0 then
        redis.call('HSET', KEYS[1] .. ':conv:' .. r.conversation_id, r.turn, cjson.encode(r.output_ids))
      end
      if tonumber(r.turn) == 1 then
        redis.call('HINCRBY', KEYS[2], 'conversationsStarted', 1)
      elseif r.spliced == true then
        redis.call('HINCRBY', KEYS[2], 'turnsSpliced', 1)
      end
    end
  end
  redis.call('HDEL', KEYS[6], id)
  redis.call('SREM', KEYS[7], id)
  redis.call('HDEL', KEYS[8], id)
  redis.call('HINCRBY', KEYS[9], bucket, tokens)
  out[#out + 1] = 1
  out[#out + 1] = total
end

commit(ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4])
for i = 7, #ARGV, 4 do
  commit(ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[i + 3])
end
-- Drop the bucket that just fell out of the window; the hash stays at `keep` entries.
redis.call('HDEL', KEYS[9], bucket - keep)

return out
