-- pause.lua: stop admissions for one provider until a moment on the Redis clock (a 429 with Retry-After).
--
-- KEYS[1] -> <prefix>:{<provider>}:pause  STRING slot time (µs) before which nothing is admitted
-- KEYS[2] -> <prefix>:{<provider>}:breaker HASH  the provider's breaker (breaker.lua): while its hold is
--                                               the pause in force and covers this one, this pause's end
--                                               is kept in its field throttled, so that closing the
--                                               breaker leaves this pause in force
--
-- ARGV[1] -> pause length µs, counted from Redis TIME (> 0)
-- ARGV[2] -> channel the pause is announced on (<prefix>:pauses; a channel, not a key)
-- ARGV[3] -> provider name, for the announcement
--
-- Returns until_us: the pause now in force (a shorter pause never cuts a longer one short).
-- The key expires one second after the pause ends. The pause in force is published on ARGV[2] as
-- "<provider> <until_us>", so that workers holding reservations made before it hold them too.
-- That message is a gate.Announcement of kind AnnouncePause (gate/announce.go writes and reads it).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local until_us = now + tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or 0)
if current > until_us then
  if tonumber(redis.call('HGET', KEYS[2], 'hold') or 0) == current and
      tonumber(redis.call('HGET', KEYS[2], 'throttled') or 0) < until_us then
    redis.call('HSET', KEYS[2], 'throttled', string.format('%.0f', until_us))
  end
  until_us = current
end
redis.call('SET', KEYS[1], string.format('%.0f', until_us), 'PX', string.format('%d', math.ceil((until_us - now) / 1000) + 1000))
redis.call('PUBLISH', ARGV[2], ARGV[3] .. ' ' .. string.format('%d', until_us))
return until_us
