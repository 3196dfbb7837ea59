--[[
  Records samples as skipped by the budget (their dataset met its budget before they were
  sent). Committed samples are left alone. Raising the budget later re-enqueues them.

  Input:
    KEYS[1] dataset done set
    KEYS[2] dataset skipped set
    ARGV[1..] sample ids

  Output: the number of samples newly recorded as skipped
]]
local n = 0
for i = 1, #ARGV do
  if redis.call('SISMEMBER', KEYS[1], ARGV[i]) == 0 then
    n = n + redis.call('SADD', KEYS[2], ARGV[i])
  end
end
return n
