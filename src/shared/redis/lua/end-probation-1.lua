--[[
  Ends an endpoint's probation if this request still holds it (see acquire-request.lua).

  Input:
    KEYS[1] the endpoint's probation key (`<lease key>:probation`)
    ARGV[1] rid of the request on probation

  Output: 1 ended | 0 not held by this rid (lapsed, or another request's)
]]
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
