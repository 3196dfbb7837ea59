--[[
  Reopens a conversation that ended early for a cause that may pass (a turn that failed, an
  error of the template or tokenizer, a history that could not be read back), so that
  `tokenmill retry-failed` resumes it at its next turn: its committed turns' output ids go back
  into its history (read from the generation files by the caller), its end record is deleted,
  the counts of ended conversations go down by one, and it leaves the list of the latest ended
  (`<KEYS[2]>:ended`, finish-conversation-4.lua). Nothing is done when its end record is
  no longer the one the caller read (reopened or finished again meanwhile).

  Input:
    KEYS[1] dataset conversations hash (conversation id -> end record JSON)
    KEYS[2] dataset stats hash          (conversationsEnded, ended:<cause>)
    KEYS[3] the conversation's history hash (turn -> output ids JSON)
    KEYS[4] dataset producer hash       (retryGen)
    ARGV[1] conversation id
    ARGV[2] the end record as the caller read it
    ARGV[3] its cause (the count `ended:<cause>` to lower)
    ARGV[4], ARGV[5], ... turn, output ids JSON: the committed turns, in order

  Output: 1 reopened | 0 its end record changed meanwhile (nothing done)
]]
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('LREM', KEYS[2] .. ':ended', 0, ARGV[2])
redis.call('HINCRBY', KEYS[2], 'conversationsEnded', -1)
if tonumber(redis.call('HINCRBY', KEYS[2], 'ended:' .. ARGV[3], -1)) <= 0 then
  redis.call('HDEL', KEYS[2], 'ended:' .. ARGV[3])
end
redis.call('DEL', KEYS[3])
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
end
-- A running producer makes another pass from line 1 (complete-dataset-2.lua).
redis.call('HINCRBY', KEYS[4], 'retryGen', 1)
return 1
