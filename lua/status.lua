-- status.lua: read-only view of one provider's budget, for operators. Changes nothing.
--
-- KEYS[1] -> <prefix>:{<provider>}:log    ZSET   member = job id, score = slot time (µs)
-- KEYS[2] -> <prefix>:{<provider>}:cum    ZSET   member = job id, score = running total of cost
-- KEYS[3] -> <prefix>:{<provider>}:pause  STRING slot time (µs) before which nothing is admitted
--
-- ARGV[1] -> margin µs, added to every window
-- ARGV[2], ARGV[3] -> limit, window µs of policy 0; and so on
--
-- Returns {now_us, paused_until_us, entries, used_0, reserved_0, reset_after_us_0, used_1, ...}
--   paused_until_us  0 when no pause is in force
--   entries          jobs in the log (admitted or reserved, not yet trimmed)
--   used_i           cost admitted in policy i's window ending now
--   reserved_i       cost of reservations after now (they will count in that window)
--   reset_after_us_i time until every entry counted in used_i + reserved_i has left the window

local log, cum, pause = KEYS[1], KEYS[2], KEYS[3]
local margin = tonumber(ARGV[1])

local function num(n)
  return string.format('%.0f', n)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local paused_until = tonumber(redis.call('GET', pause) or 0)
if paused_until <= now then paused_until = 0 end

local total = tonumber(redis.call('ZREVRANGE', cum, 0, 0, 'WITHSCORES')[2] or 0)
local newest = tonumber(redis.call('ZREVRANGE', log, 0, 0, 'WITHSCORES')[2] or 0)

-- cost of the entries with slot > at
local function after(at)
  local older = redis.call('ZREVRANGEBYSCORE', log, num(at), '-inf', 'LIMIT', 0, 1)
  return total - tonumber(redis.call('ZSCORE', cum, older[1] or '') or 0)
end

local reply = {now, paused_until, redis.call('ZCARD', log)}
local reserved = after(now)
for i = 2, #ARGV, 2 do
  local window = tonumber(ARGV[i + 1]) + margin
  local counted = after(now - window)
  local reset = 0
  if counted > 0 then reset = math.max(0, newest + window - now) end
  reply[#reply + 1] = counted - reserved
  reply[#reply + 1] = reserved
  reply[#reply + 1] = reset
end
return reply
