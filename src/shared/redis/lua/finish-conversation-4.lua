--[[
  Records a conversation regenerated turn by turn as finished, once: complete (every turn
  committed) or ended early (a turn whose prompt no longer fits the context, a turn that failed,
  a history that cannot be read back). Its history (`<KEYS[4]>:conv:<id>`, see
  commit-sample-9.lua) is deleted in the same step. A failed turn's failure record is folded into
  the conversation's end: the turn is not retried on its own (its conversation has ended).

  Input:
    KEYS[1] dataset conversations hash (conversation id -> end record JSON)
    KEYS[2] dataset stats hash          (conversationsComplete, conversationsEnded)
    KEYS[3] dataset failed hash         (sample id -> reason JSON)
    KEYS[4] dataset done set            (the history lives beside it)
    ARGV[1] conversation id
    ARGV[2] end record (JSON)
    ARGV[3] 'complete' | 'ended'
    ARGV[4] the failed turn's sample id, or ''
    ARGV[5] why it ended early, in one word (context | failed | error | history-lost | tool-…), or ''

  Beside the stats hash: `<KEYS[2]>:ended`, the last 20 end records of conversations ended early
  (what `status` and the pipeline page show), and per cause a count `ended:<cause>` in the stats
  and `ended-example:<cause>`, the id of the latest conversation that ended so (`tokenmill show`
  looks at it).

  Output: 1 when this call finished it, 0 when it was finished already.
]]
local first = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if first == 1 then
  if ARGV[3] == 'complete' then
    redis.call('HINCRBY', KEYS[2], 'conversationsComplete', 1)
  else
    redis.call('HINCRBY', KEYS[2], 'conversationsEnded', 1)
    if ARGV[5] ~= nil and ARGV[5] ~= '' then
      redis.call('HINCRBY', KEYS[2], 'ended:' .. ARGV[5], 1)
      redis.call('HSET', KEYS[2], 'ended-example:' .. ARGV[5], ARGV[1])
    end
    redis.call('LPUSH', KEYS[2] .. ':ended', ARGV[2])
    redis.call('LTRIM', KEYS[2] .. ':ended', 0, 19)
  end
end
if ARGV[4] ~= '' then redis.call('HDEL', KEYS[3], ARGV[4]) end
redis.call('DEL', KEYS[4] .. ':conv:' .. ARGV[1])
return first
