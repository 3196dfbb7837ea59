--[[
  A turn of a conversation regenerated turn by turn (`turns: all`) that `budget: strict` aborted
  mid-answer: its partial answer is not committed (a cut-off answer would become the history the
  next turns are generated on, and no row may supervise it as a finished turn). Its tokens were
  generated, so they count against the budget, as a commit would count them; the turn is recorded
  as skipped by the budget, so it is generated again, whole, when the conversation resumes.

  Input:
    KEYS[1] dataset done set
    KEYS[2] dataset stats hash        (outputTokens, abortedTurns, abortedTokens, tokenBudget, budgetMetMs)
    KEYS[3] dataset in-flight zset    (rid -> expiry; beside it `<KEYS[3]>:start` and `:progress`)
    KEYS[4] endpoint lease zset       (may be the in-flight key again)
    KEYS[5] dataset skipped set
    ARGV[1] the turn's sample id
    ARGV[2] tokens the aborted request produced
    ARGV[3] rid

  Output: the dataset's output tokens after it; -1 when the turn was committed meanwhile (by
          another delivery: nothing is counted, its commit stands)
]]
--- @include "count-output-tokens"
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
redis.call('HDEL', KEYS[3] .. ':start', ARGV[3])
redis.call('HDEL', KEYS[3] .. ':progress', ARGV[3])
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then
  return -1
end
local tokens = tonumber(ARGV[2])
local t = redis.call('TIME')
local total = countOutputTokens(KEYS[2], tokens, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HINCRBY', KEYS[2], 'abortedTurns', 1)
redis.call('HINCRBY', KEYS[2], 'abortedTokens', tokens)
redis.call('SADD', KEYS[5], ARGV[1])
return total
