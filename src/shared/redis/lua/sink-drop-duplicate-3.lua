--[[
  Drops results whose sample is already on disk, and corrects the dataset's counters so that
  they equal the lines on disk. Such a result is either the very commit whose line the sink
  wrote before a crash let it trim the entry (the correction is then 0), or a second commit
  after Redis lost the first one (an OS crash with `appendfsync everysec` loses about the last
  second of writes; the sample was then generated again): that commit counted its own tokens;
  the line on disk is the one kept. Its record stays counted once.

  Input:
    KEYS[1] the dataset's sink lock
    KEYS[2] the dataset's results stream
    KEYS[3] the dataset's stats hash
    ARGV[1] this sink's lock token
    ARGV[2], ARGV[3], ARGV[4], ... triples: stream entry id, completion tokens of the line on
            disk, completion tokens of the stream entry

  Output: entries dropped (>= 0; an entry already gone changes nothing) | -1 the lock is not
          ours (nothing changed)
]]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local dropped = 0
for i = 2, #ARGV, 3 do
  if redis.call('XDEL', KEYS[2], ARGV[i]) == 1 then
    dropped = dropped + 1
    local disk = tonumber(ARGV[i + 1])
    local again = tonumber(ARGV[i + 2])
    redis.call('HINCRBY', KEYS[3], 'outputTokens', disk - again)
    redis.call('HINCRBY', KEYS[3], 'outputTokensSq', disk * disk - again * again)
  end
end
return dropped
