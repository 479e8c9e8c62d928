-- cancel.lua: `worker cancel`. A job not yet on its way is never admitted again (lua/family's reserve denies
-- it, reply cancelled); one that has left, or is leaving, is told, and nothing changes.
--
-- KEYS[1] -> <prefix>:{<provider>}:ids (sliding_log: ...:log) ZSET the id record (lua/family): score = slot
-- KEYS[2] -> <prefix>:{<provider>}:marks ZSET  the id record's marks (lua/family): this script writes and
--                                              removes id.."\0c", score = until when the cancel stands (µs)
-- KEYS[3] -> <prefix>:{<provider>}:cancels HASH the cancels' reasons: field id, value "<until_us> <reason>";
--                                              the key lasts a second past the latest cancel, and a cancel
--                                              that finds more than 256 fields drops the lapsed ones
--
-- KEYS[4] -> <prefix>:{<provider>}:flight ZSET the in-flight leases (lua/family; read by show only)
-- KEYS[5..] -> <prefix>:{<provider>}:journal:<bucket> HASH the job journal's hashes that may hold the job
--                                              (journal.lua; none when there is no journal): field id,
--                                              value "<left_us> <outcome>"
--
-- ARGV[1] -> op: 'cancel', 'peek', 'settle', 'reason' or 'show'
-- ARGV[2] -> the job's id: 1..600 bytes, no NUL, no "\31" (the gate ids of its attempts are id, then
--            id.."\31"..k for its k-th retry: gate.GateID)
-- ARGV[3] -> attempts n >= 1: the gate ids looked for are the id and its first n-1 retries'
-- ARGV[4] -> dedup µs (lua/family's S[2]): an admission older than its slot plus this has left the record
-- ARGV[5] -> cancel: µs the cancel stands (worker.max_deferral_age); else 0
-- ARGV[6] -> cancel: the announcement channel (<prefix>:pauses); else ''
-- ARGV[7] -> cancel: the provider's name; else ''
-- ARGV[8] -> cancel: the reason (text, may be ''); else ''
--
-- cancel returns {state, slot_us, now_us}, now_us the Redis clock:
--   0  not admitted (none of its gate ids is in the record): the mark is written; slot_us 0
--   1  it has left or is leaving: an admission at slot_us (the latest) now or past, a request marked sent
--      (id.."\0s"), or a request in the journal that left at slot_us and has no outcome yet, or a final
--      one (succeeded, declined, permanent, exhausted); nothing is written. A job whose request left and
--      was answered for a retry (its outcome another) is queued again: cancelled as below
--   2  admitted for slot_us, still ahead: the mark is written and "<provider> cancel <id>" published
--      (a gate.Announcement of kind AnnounceCancel), so that the worker holding the slot gives it up
--      (released, its next reserve denied). The caller waits for the admission to leave the record, or
--      for its slot to pass, then calls settle
--   3  cancelled already (the mark stands); slot_us 0
-- show returns what the gate holds of the job, writing nothing: {now_us, cancel_until_us (0: none), reason,
-- left_us (0: not in the journal), outcome (the journal's; '' for none), n, then for each of its n gate ids (ARGV[3]) slot_us, sent_us, duplicate_us, probe_us (0 where none: its
-- admission in the record, and its marks' times), then member, lapse_us of each standing in-flight lease
-- of any of them}
-- reason returns the reason of the cancel standing ('' for none); it writes nothing.
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

-- journal is the job's latest entry in the journal: when its request left (nil: none) and its outcome.
local function journal()
  local left, outcome
  for k = 5, #KEYS do
    local l, o = string.match(redis.call('HGET', KEYS[k], id) or '', '^(%d+) ?(.*)$')
    l = tonumber(l)
    if l and (not left or l > left) then left, outcome = l, o end
  end
  return left, outcome or ''
end
local final = {[''] = true, succeeded = true, declined = true, permanent = true, exhausted = true}

local slot = admission()
if op == 'peek' then return {slot and 2 or 0, slot or 0, now} end
if op == 'show' then
  local gids = {id}
  for k = 1, n - 1 do gids[#gids + 1] = id .. '\31' .. k end
  local standing = tonumber(redis.call('ZSCORE', KEYS[2], mark) or nil)
  if standing and standing < now then standing = nil end
  local left, outcome = journal()
  local out = {now, standing or 0, '', left or 0, outcome, n}
  if standing then out[3] = string.match(redis.call('HGET', KEYS[3], id) or '', '^%d+ (.*)$') or '' end
  local slots = redis.call('ZMSCORE', KEYS[1], unpack(gids))
  for k, g in ipairs(gids) do
    local s = tonumber(slots[k] or nil)
    if s and s < now - dedup then s = nil end
    local m = redis.call('ZMSCORE', KEYS[2], g .. '\0s', g .. '\0d', g .. '\0p')
    out[#out + 1] = s or 0
    for j = 1, 3 do
      local v = tonumber(m[j] or nil)
      if v and v < now then v = nil end
      out[#out + 1] = v or 0
    end
  end
  if KEYS[4] then
    local leases = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. string.format('%d', now), '+inf', 'WITHSCORES')
    for j = 1, #leases, 2 do
      local owner = string.match(leases[j], '^([^%z]*)%z')
      for _, g in ipairs(gids) do
        if owner == g then out[#out + 1], out[#out + 2] = leases[j], tonumber(leases[j + 1]) end
      end
    end
  end
  return out
end
if op == 'reason' then
  local standing = tonumber(redis.call('ZSCORE', KEYS[2], mark) or nil)
  if not standing or standing < now then return '' end
  return string.match(redis.call('HGET', KEYS[3], id) or '', '^%d+ (.*)$') or ''
end
if op == 'settle' then
  if slot then
    redis.call('ZREM', KEYS[2], mark)
    redis.call('HDEL', KEYS[3], id)
    return {1, slot, now}
  end
  return {0, 0, now}
end

local standing = tonumber(redis.call('ZSCORE', KEYS[2], mark) or nil)
if standing and standing >= now then return {3, 0, now} end
local sent = tonumber(redis.call('ZSCORE', KEYS[2], id .. '\0s') or nil)
if (slot and slot <= now) or (sent and sent >= now) then return {1, slot or 0, now} end
local left, outcome = journal()
if left and final[outcome] and not slot then return {1, left, now} end
local keep = tonumber(ARGV[5])
local ms = math.ceil(keep / 1000) + 1000
redis.call('ZADD', KEYS[2], string.format('%d', now + keep), mark)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('(%d', now))
if redis.call('PTTL', KEYS[2]) < ms then redis.call('PEXPIRE', KEYS[2], string.format('%d', ms)) end
if redis.call('HLEN', KEYS[3]) > 256 then
  local all = redis.call('HGETALL', KEYS[3])
  for j = 1, #all, 2 do
    if (tonumber(string.match(all[j + 1], '^%d+')) or 0) < now then redis.call('HDEL', KEYS[3], all[j]) end
  end
end
redis.call('HSET', KEYS[3], id, string.format('%d', now + keep) .. ' ' .. ARGV[8])
if redis.call('PTTL', KEYS[3]) < ms then redis.call('PEXPIRE', KEYS[3], string.format('%d', ms)) end
if slot then
  redis.call('PUBLISH', ARGV[6], ARGV[7] .. ' cancel ' .. id)
  return {2, slot, now}
end
return {0, 0, now}
