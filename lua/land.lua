-- land.lua: end an in-flight lease (lua/family, S[7]): the job's request has ended, whatever its
-- outcome, or the job gave its admission up. The first job held back by the cap may then go: the landing
-- is announced, so that workers waiting for a lease ask again at once rather than at their next poll.
--
-- KEYS[1] -> <prefix>:{<provider>}:flight  ZSET  the leases (see lua/family)
--
-- ARGV[1] -> the lease: id.."\0"..now_us of the admission that took it (id.."\0d"..now_us: a duplicate)
-- ARGV[2] -> the announcement channel, <prefix>:pauses
-- ARGV[3] -> the provider's name
-- ARGV[4] -> the cap (max in flight): the end is announced only when the cap was full before it (leases,
--            lapsed ones included, at least the cap), for only then may a job be waiting for it
--
-- Returns 1 when the lease stood (and is now ended, and announced as "<provider> landed" if the cap was
-- full), else 0 (it had lapsed, or was ended before).
-- "<provider> landed" is a gate.Announcement of kind AnnounceLanded (gate/announce.go writes and reads it).

local before = redis.call('ZCARD', KEYS[1])
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
if before >= tonumber(ARGV[4]) then redis.call('PUBLISH', ARGV[2], ARGV[3] .. ' landed') end
return 1
