--[[
  Deletes results the sink has written to disk, fenced by the sink's lock: a sink that lost
  its lock (it lapsed during a Redis outage or a freeze and another sink took it) deletes
  nothing, so whatever it wrote late is still in Redis for the holder to write.

  Input:
    KEYS[1] the dataset's sink lock
    KEYS[2] the dataset's results stream
    ARGV[1] this sink's lock token
    ARGV[2..] stream entry ids

  Output: entries deleted (>= 0) | -1 the lock is not ours (nothing deleted)
]]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
return redis.call('XDEL', KEYS[2], unpack(ARGV, 2))
