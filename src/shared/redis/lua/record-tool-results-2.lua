--[[
  Records the tool results that follow a turn of a conversation regenerated turn by turn (the
  results a tool executor returned for the turn's calls), once: a crash between the call and the
  next turn neither calls again nor loses them, and two deliveries racing keep the first one's.
  They live in the conversation's history hash (field `r<turn>`, beside the turns' output ids),
  which finish-conversation-4.lua deletes with the rest; a conversation already finished records
  nothing.

  Input:
    KEYS[1] dataset conversations hash (conversation id -> end record JSON)
    KEYS[2] the conversation's history hash
    ARGV[1] conversation id
    ARGV[2] the turn whose calls the results answer
    ARGV[3] the results (JSON)

  Output: the results recorded for the turn (these, or those recorded first), or false when the
  conversation has finished.
]]
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return false end
local field = 'r' .. ARGV[2]
redis.call('HSETNX', KEYS[2], field, ARGV[3])
return redis.call('HGET', KEYS[2], field)
