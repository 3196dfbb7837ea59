--[[
  Included by the scripts that count a sample's output tokens once (commit-sample-9.lua,
  sink-restore-5.lua, discard-aborted-turn-5.lua): the budget-met rule has this one home.

  countOutputTokens(statsKey, tokens, now) adds `tokens` to the dataset's `outputTokens` and, when
  they are the ones that reach the dataset's `tokenBudget`, records that moment as `budgetMetMs`
  (after it, no request may be sent for the dataset). A dataset without a budget has no
  `tokenBudget` field. Returns the dataset's output tokens after it.
]]
local function countOutputTokens(statsKey, tokens, now)
  local total = redis.call('HINCRBY', statsKey, 'outputTokens', tokens)
  local budget = tonumber(redis.call('HGET', statsKey, 'tokenBudget'))
  if budget ~= nil and total >= budget and total - tokens < budget then
    redis.call('HSET', statsKey, 'budgetMetMs', now)
  end
  return total
end
