-- cancel.lua: `worker cancel`. A job not yet on its way is never admitted again (lua/family's reserve denies
-- it, reply cancelled); one that has left, or is leaving, is told, and nothing changes.
--
-- KEYS[1] -> <prefix>:{<provider>}:ids (sliding_log: ...:log) ZSET the id record (lua/family): score = slot
-- KEYS[2] -> <prefix>:{<provider>}:marks ZSET  the id record's marks (lua/family): this script writes and
--                                              removes id.."\0c", score = until when the cancel stands (µs)
--
-- ARGV[1] -> op: 'cancel', 'peek' or 'settle'
-- ARGV[2] -> the job's id: 1..600 bytes, no NUL, no "\31" (the gate ids of its attempts are id, then
--            id.."\31"..k for its k-th retry: gate.GateID)
-- ARGV[3] -> attempts n >= 1: the gate ids looked for are the id and its first n-1 retries'
-- ARGV[4] -> dedup µs (lua/family's S[2]): an admission older than its slot plus this has left the record
-- ARGV[5] -> cancel: µs the cancel stands (worker.max_deferral_age); else 0
-- ARGV[6] -> cancel: the announcement channel (<prefix>:pauses); else ''
-- ARGV[7] -> cancel: the provider's name; else ''
--
-- cancel returns {state, slot_us, now_us}, now_us the Redis clock:
--   0  not admitted (none of its gate ids is in the record): the mark is written; slot_us 0
--   1  it has left or is leaving: an admission at slot_us (the latest) now or past, or a request marked
--      sent (id.."\0s"); nothing is written. A cancel that stood already is not lifted
--   2  admitted for slot_us, still ahead: the mark is written and "<provider> cancel <id>" published
--      (a gate.Announcement of kind AnnounceCancel), so that the worker holding the slot gives it up
--      (released, its next reserve denied). The caller waits for the admission to leave the record, or
--      for its slot to pass, then calls settle
--   3  cancelled already (the mark stands); slot_us 0
-- peek returns {2, slot_us, now_us} while an admission of the job is in the record, else {0, 0, now_us};
-- it writes nothing.
-- settle returns {state, slot_us, now_us}: 1 when an admission of the job is still in the record (its
-- holder did not give it up: it left, or is leaving, at slot_us): the mark goes; else 0, the mark stays.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local op, id, n, dedup = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local mark = id .. '\0c'

-- admission is the latest slot at which one of the job's gate ids is in the record (nil: none).
local function admission()
  local gids = {id}
  for k = 1, n - 1 do gids[#gids + 1] = id .. '\31' .. k end
  local latest
  for _, s in ipairs(redis.call('ZMSCORE', KEYS[1], unpack(gids))) do
    s = tonumber(s or nil)
    if s and s >= now - dedup and (not latest or s > latest) then latest = s end
  end
  return latest
end

local slot = admission()
if op == 'peek' then return {slot and 2 or 0, slot or 0, now} end
if op == 'settle' then
  if slot then
    redis.call('ZREM', KEYS[2], mark)
    return {1, slot, now}
  end
  return {0, 0, now}
end

local standing = tonumber(redis.call('ZSCORE', KEYS[2], mark) or nil)
if standing and standing >= now then return {3, 0, now} end
local sent = tonumber(redis.call('ZSCORE', KEYS[2], id .. '\0s') or nil)
if (slot and slot <= now) or (sent and sent >= now) then return {1, slot or 0, now} end
local keep = tonumber(ARGV[5])
local ms = math.ceil(keep / 1000) + 1000
redis.call('ZADD', KEYS[2], string.format('%d', now + keep), mark)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('(%d', now))
if redis.call('PTTL', KEYS[2]) < ms then redis.call('PEXPIRE', KEYS[2], string.format('%d', ms)) end
if slot then
  redis.call('PUBLISH', ARGV[6], ARGV[7] .. ' cancel ' .. id)
  return {2, slot, now}
end
return {0, 0, now}
