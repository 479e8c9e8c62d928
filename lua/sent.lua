-- sent.lua: record that a job's request reached its provider and was accepted, though its delivery could
-- not be settled (the broker will deliver it again). A stale redelivery of it is then a plain duplicate:
-- the provider counted the first request and will only replay it, so the gate need not move its entry.
--
-- KEYS[1] -> <prefix>:{<provider>}:marks  ZSET   the id record's marks (lua/family): member id.."\0s",
--                                                score = until when the mark matters (µs, Redis clock)
--
-- ARGV[1] -> job id, as admitted
-- ARGV[2] -> µs to keep the mark: as long as the record keeps an id whose slot is past (its dedup)
--
-- The marks whose time is past go; the key lasts a second past the newest mark (its expiry is only ever
-- extended). Returns 1.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local keep = tonumber(ARGV[2])
local ms = math.ceil(keep / 1000) + 1000
redis.call('ZADD', KEYS[1], string.format('%d', now + keep), ARGV[1] .. '\0s')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%d', now))
if redis.call('PTTL', KEYS[1]) < ms then
  redis.call('PEXPIRE', KEYS[1], string.format('%d', ms))
end
return 1
