--[[
  Gives a dataset's failed samples their attempts back, atomically, so that a producer
  running at the same time sends them again (`tokenmill retry-failed`).

  In one script, nothing can land between reading the failed ids and deleting them: the
  fields deleted are exactly the ones read, and a failure recorded after the script (by
  fail-sample-6.lua) keeps its entry. The producer's cursor is not touched: the bump of
  `retryGen` tells a running producer that a pass from line 1 is needed (it reads the
  generation when a pass starts and completes the dataset only if it is unchanged, see
  complete-dataset-2.lua); a producer started later makes that pass anyway.

  With ARGV[1] (the dataset queue's key prefix, `<bull prefix>:generate-<dataset>:`), the
  failures that a failed batch job carries are left alone: the caller retries those jobs
  (the same as Bull Board's Retry), and the worker that takes each one claims them
  (claim-failed-3.lua). A record is left when its job (the record's `job`) is in the
  queue's failed set, or when a retried job claimed it (`retrying`) and has not completed.
  Every other record is given back here: no job named (recorded before failed jobs
  existed), its job removed, or its job still running its first delivery.

  Input:
    KEYS[1] dataset failed hash       (sample id -> failure JSON)
    KEYS[2] dataset attempts hash     (sample id -> attempts spent)
    KEYS[3] dataset stats hash        (status)
    KEYS[4] dataset producer hash     (epoch, line, retryGen)
    ARGV[1] the queue's key prefix (optional: without it, every failure is given back)

  Output: the number of failed samples given back
]]
local prefix = ARGV[1]
local ids = {}
if prefix == nil or prefix == '' then
  ids = redis.call('HKEYS', KEYS[1])
else
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local take = true
    local ok, rec = pcall(cjson.decode, all[i + 1])
    local job = ok and type(rec) == 'table' and rec['job'] or nil
    if type(job) == 'string' and redis.call('EXISTS', prefix .. job) == 1 then
      if redis.call('ZSCORE', prefix .. 'failed', job) then
        take = false
      elseif rec['retrying'] == true and not redis.call('ZSCORE', prefix .. 'completed', job) then
        take = false
      end
    end
    if take then
      ids[#ids + 1] = all[i]
    end
  end
end
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
