-- journal.lua: the job journal, which remembers when each job's request left and how its handling ended,
-- for `worker cancel` (a job that left is told, never cancelled) and `worker job show`.
--
-- KEYS[1] -> <prefix>:{<provider>}:journal:<bucket> HASH field = job id, value = "<left_us> <outcome>"
--            (outcome '' until the handling ended); bucket = the request's left time (seconds) / 600: one
--            hash a ten minutes, expiring a journal's length after its end (gate.Options.Journal)
--
-- ARGV[1] -> when the key expires: ms since the Unix epoch
-- ARGV[2], ARGV[3], ... -> field, value pairs (1..1000 of them)
--
-- An entry is written unless the hash holds a later request of the job (workers write in the background,
-- so an older handling's end may come after a newer request's departure). Returns the number written.

local written = 0
for j = 2, #ARGV, 2 do
  local left = tonumber(string.match(ARGV[j + 1], '^%d+') or nil)
  local held = tonumber(string.match(redis.call('HGET', KEYS[1], ARGV[j]) or '', '^%d+') or nil)
  if not held or (left and left >= held) then
    redis.call('HSET', KEYS[1], ARGV[j], ARGV[j + 1])
    written = written + 1
  end
end
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
return written
