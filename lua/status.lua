-- status.lua: read-only view of one provider's budget, for operators. Changes nothing.
--
-- KEYS[1] -> <prefix>:{<provider>}:log    ZSET   one member per unit of cost, score = slot time (µs)
-- KEYS[2] -> <prefix>:{<provider>}:pause  STRING slot time (µs) before which nothing is admitted
--
-- ARGV[1] -> margin µs, added to every window
-- ARGV[2], ARGV[3] -> pace, tolerance µs (sliding_log.lua's; unused here)
-- ARGV[4], ARGV[5] -> limit, window µs of policy 0; and so on
--
-- Returns {now_us, paused_until_us, units, used_0, reserved_0, remaining_0, reset_after_us_0, used_1, ...}
--   (the shape of every algorithm's status; family.lua gives the others the same)
--   paused_until_us  0 when no pause is in force
--   units            members in the log (admitted or reserved units of cost, not yet trimmed)
--   used_i           units admitted in policy i's window ending now
--   reserved_i       units reserved after now (they will count in that window)
--   remaining_i      limit - used_i - reserved_i, never negative
--   reset_after_us_i time until every unit counted in used_i + reserved_i has left the window

local log, pause = KEYS[1], KEYS[2]
local margin = tonumber(ARGV[1])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local paused_until = tonumber(redis.call('GET', pause) or 0)
if paused_until <= now then paused_until = 0 end
local newest = tonumber(redis.call('ZREVRANGE', log, 0, 0, 'WITHSCORES')[2] or 0)
local reserved = redis.call('ZCOUNT', log, now + 1, '+inf')

local reply = {now, paused_until, redis.call('ZCARD', log)}
for i = 4, #ARGV, 2 do
  local window = tonumber(ARGV[i + 1]) + margin
  local counted = redis.call('ZCOUNT', log, now - window + 1, '+inf')
  local reset = 0
  if counted > 0 then reset = math.max(0, newest + window - now) end
  reply[#reply + 1] = counted - reserved
  reply[#reply + 1] = reserved
  reply[#reply + 1] = math.max(0, tonumber(ARGV[i]) - counted)
  reply[#reply + 1] = reset
end
return reply
