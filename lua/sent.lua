-- sent.lua: record that a job's request reached its provider and was accepted, though its delivery could
-- not be settled (the broker will deliver it again). A stale redelivery of it is then a plain duplicate:
-- the provider counted the first request and will only replay it, so the gate need not move its entry.
--
-- KEYS[1] -> <prefix>:{<provider>}:sent   HASH   job id -> 1
--
-- ARGV[1] -> job id, as admitted
-- ARGV[2] -> ms to keep the mark: the longest window plus margin; the key's expiry is only ever extended
--
-- Returns 1.

redis.call('HSET', KEYS[1], ARGV[1], 1)
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
