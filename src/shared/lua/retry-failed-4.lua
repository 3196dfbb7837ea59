--[[
  Gives a dataset's failed samples their attempts back, atomically, so that a producer
  running at the same time sends them again (`tokenmill retry-failed`).

  In one script, nothing can land between reading the failed ids and deleting them: the
  fields deleted are exactly the ones read, and a failure recorded after the script (by
  fail-sample.lua) keeps its entry. The producer's cursor is not touched: the bump of
  `retryGen` tells a running producer that a pass from line 1 is needed (it reads the
  generation when a pass starts and completes the dataset only if it is unchanged, see
  complete-dataset-2.lua); a producer started later makes that pass anyway.

  Input:
    KEYS[1] dataset failed hash       (sample id -> reason JSON)
    KEYS[2] dataset attempts hash     (sample id -> attempts spent)
    KEYS[3] dataset stats hash        (status)
    KEYS[4] dataset producer hash     (epoch, line, retryGen)

  Output: the number of failed samples given back
]]
local ids = redis.call('HKEYS', KEYS[1])
local n = #ids
if n == 0 then
  return 0
end
-- unpack() has a stack limit: delete in slices.
for i = 1, n, 1000 do
  local last = math.min(i + 999, n)
  redis.call('HDEL', KEYS[1], unpack(ids, i, last))
  redis.call('HDEL', KEYS[2], unpack(ids, i, last))
end
redis.call('HSET', KEYS[3], 'status', 'in_progress')
redis.call('HINCRBY', KEYS[4], 'retryGen', 1)
return n
