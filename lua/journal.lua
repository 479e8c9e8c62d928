-- journal.lua: the job journal, which remembers when each job's request left and how the job ended, for
-- `worker cancel` (a job that left is told, never cancelled) and `worker job show`.
--
-- KEYS[1] -> <prefix>:{<provider>}:journal:<bucket> HASH field = job id, value = "<left_us> <outcome>"
--            (outcome '' until the job ended); bucket = the request's left time (seconds) / 600: one hash a
--            ten minutes, expiring a journal's length after its end (gate.Options.Journal)
--
-- ARGV[1] -> when the key expires: ms since the Unix epoch
-- ARGV[2], ARGV[3], ... -> field, value pairs (at least one)
--
-- Returns the number of pairs written.

redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
return (#ARGV - 1) / 2
