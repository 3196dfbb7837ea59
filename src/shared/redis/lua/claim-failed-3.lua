--[[
  Claims failed samples for a retry of the batch job they failed in: Bull Board's Retry (or
  `tokenmill retry-failed`) moved the failed job back to the queue, and the worker that took
  it sends exactly these samples again, with fresh attempts.

  A failure record (the failed hash's JSON) names the job it failed in (`job`). Only that job
  may claim it, so a prompt given back another way (`retry-failed` handing it to the producer,
  a later failure in another job) is never sent twice. The claim keeps the record, marked
  `retrying`: the producer still skips the sample, `retry-failed` leaves it to this job, and the
  record leaves when the sample commits (commit-sample-9.lua), fails again (fail-sample-6.lua
  rewrites it) or is released (release-claims-1.lua). A job that claims again after a hand-back or a
  stall keeps the attempts spent since its first claim.

  Input:
    KEYS[1] dataset done set
    KEYS[2] dataset failed hash       (sample id -> failure JSON)
    KEYS[3] dataset attempts hash     (sample id -> attempts spent)
    ARGV[1] the job id
    ARGV[2..] sample ids

  Output: one code per sample id, in order:
    1   claimed: send it
    0   committed meanwhile: send nothing
    -1  no failure recorded (given back another way, or it never failed): send nothing
    -2  its failure belongs to another job: send nothing
]]
local jobId = ARGV[1]
local out = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local code
  if redis.call('SISMEMBER', KEYS[1], id) == 1 then
    code = 0
  else
    local raw = redis.call('HGET', KEYS[2], id)
    if not raw then
      code = -1
    else
      local ok, rec = pcall(cjson.decode, raw)
      if not ok or type(rec) ~= 'table' or rec['job'] ~= jobId then
        code = -2
      else
        if rec['retrying'] ~= true then
          rec['retrying'] = true
          redis.call('HSET', KEYS[2], id, cjson.encode(rec))
          redis.call('HDEL', KEYS[3], id)
        end
        code = 1
      end
    end
  end
  out[#out + 1] = code
end
return out
