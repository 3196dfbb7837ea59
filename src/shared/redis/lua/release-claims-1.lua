--[[
  Drops the failure records a retry job claimed (claim-failed-3.lua) for samples that ended
  without a commit or a new failure: skipped by the budget, so they count as skipped, not
  failed (raising the budget later sends them again, like any skipped sample).

  Input:
    KEYS[1] dataset failed hash       (sample id -> failure JSON)
    ARGV[1] the job id
    ARGV[2..] sample ids

  Output: the number of records dropped
]]
local n = 0
for i = 2, #ARGV do
  local raw = redis.call('HGET', KEYS[1], ARGV[i])
  if raw then
    local ok, rec = pcall(cjson.decode, raw)
    if ok and type(rec) == 'table' and rec['job'] == ARGV[1] and rec['retrying'] == true then
      n = n + redis.call('HDEL', KEYS[1], ARGV[i])
    end
  end
end
return n
