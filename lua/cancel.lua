-- cancel.lua: `worker cancel` and `worker job show`. A job not yet on its way is never admitted again
-- (lua/family's reserve meets its mark first and denies it, reply cancelled); one that has left, or will
-- leave, is told, and nothing changes. A job admitted for a slot still ahead is taken back only when the
-- worker holding the slot says, in this script ('ack'), that it will not send it.
--
-- KEYS[1] -> <prefix>:{<provider>}:ids (sliding_log: ...:log) ZSET the id record (lua/family): score = slot
-- KEYS[2] -> <prefix>:{<provider>}:marks ZSET  the id record's marks (lua/family); this script's, each
--                                              score = until when it stands (µs): id.."\0c" the cancel;
--                                              id.."\0cw" a cancel waiting for the holder of a slot ahead
--                                              (until the slot plus the notice); id.."\0cg" the holder gave
--                                              the slot up ('ack')
-- KEYS[3] -> <prefix>:{<provider>}:cancels HASH the cancels' reasons: field id, value "<until_us> <reason>";
--                                              field id.."\0left", value "<until_us> <slot_us>": a cancel
--                                              settled as left (a later one says so too);
--                                              the key lasts a second past the latest cancel, and a cancel
--                                              that finds more than 256 fields drops the lapsed ones
-- KEYS[4] -> <prefix>:{<provider>}:flight ZSET the in-flight leases (lua/family; read by show only)
-- KEYS[5..] -> <prefix>:{<provider>}:journal:<bucket> HASH the job journal's hashes that may hold the job
--                                              (journal.lua; none when there is no journal): field id,
--                                              value "<left_us> <outcome>"
--
-- ARGV[1] -> op: 'cancel', 'ack', 'peek', 'settle', 'reason' or 'show'
-- ARGV[2] -> the job's id: 1..600 bytes, no NUL, no "\31" (the gate ids of its attempts are id, then
--            id.."\31"..k for its k-th retry: gate.GateID)
-- ARGV[3] -> attempts n >= 1: the gate ids looked for are the id and its first n-1 retries'
-- ARGV[4] -> dedup µs (lua/family's S[2]): an admission older than its slot plus this has left the record
-- ARGV[5] -> cancel: µs the cancel stands; settle: how long a cancel found left is remembered; else 0
-- ARGV[6] -> cancel, settle: µs the holder of a slot ahead has past the slot to give it up (the notice);
--            else 0
-- ARGV[7] -> cancel: the announcement channel (<prefix>:pauses); else ''
-- ARGV[8] -> cancel: the provider's name; else ''
-- ARGV[9] -> cancel: the reason (text, may be ''); else ''
--
-- cancel returns {state, slot_us, now_us}, now_us the Redis clock:
--   0  not admitted, nor known to have left: the mark is written; slot_us 0
--   1  it has left, or will: an admission at slot_us (the latest) now or past; a cancel settled as left
--      (id.."\0left" in KEYS[3]); a request marked sent
--      (id.."\0s"); a slot ahead on which a duplicate was let go too (two holders: it cannot be taken
--      back); or, with no admission in the record, a request in the journal that left at slot_us and was
--      not answered 429 (throttled: the provider did not take it, the job is queued again). Nothing is
--      written
--   2  admitted for slot_us, still ahead: the mark and its wait (id.."\0cw") are written and
--      "<provider> cancel <id>" published (a gate.Announcement of kind AnnounceCancel). The caller waits
--      until the slot plus the notice for the holder's 'ack', then calls settle
--   3  cancelled already (the mark stands, no wait on it); slot_us 0
--   4  a cancel of it is waiting for the holder of slot_us (another caller's): ask again after it
-- ack (the holder of a slot ahead, told): 1 when a cancel waits for it: the wait becomes id.."\0cg" (given
--   up), and the holder must not send the job; 0 when none does (the cancel was settled as left): the
--   holder sends it on its slot
-- settle (after cancel's 2) returns {state, slot_us, now_us}: 5 when the holder gave the slot up ('ack'):
--   the mark stays; else 1 (left at slot_us): the mark, its wait and its reason go
-- show returns what the gate holds of the job, writing nothing: {now_us, cancel_until_us (0: none),
--   reason, left_us (0: not in the journal), outcome (the journal's; '' for none), n, then for each of its
--   n gate ids slot_us, sent_us, duplicate_us, probe_us (0 where none: its admission in the record, and its
--   marks' times), then member, lapse_us of each standing in-flight lease of any of them}
-- peek returns 5 once the holder gave the slot up, 2 while the cancel waits for it, else 0; reason the
-- reason of the cancel standing ('' for none). Neither writes.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local op, id, n, dedup = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local mark, waiting, given = id .. '\0c', id .. '\0cw', id .. '\0cg'

local function gids()
  local out = {id}
  for k = 1, n - 1 do out[#out + 1] = id .. '\31' .. k end
  return out
end
-- standing is a mark's score while it stands (nil: absent or past).
local function standing(member)
  local s = tonumber(redis.call('ZSCORE', KEYS[2], member) or nil)
  if s and s >= now then return s end
  return nil
end
-- admission is the latest slot at which one of the job's gate ids is in the record (nil: none), and
-- whether a duplicate was let go on one of them (its mark stands).
local function admission()
  local ids = gids()
  local latest, dup
  for k, s in ipairs(redis.call('ZMSCORE', KEYS[1], unpack(ids))) do
    s = tonumber(s or nil)
    if s and s >= now - dedup and (not latest or s > latest) then latest = s end
    if s and standing(ids[k] .. '\0d') then dup = true end
  end
  return latest, dup
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
local function lift()
  redis.call('ZREM', KEYS[2], mark, waiting, given)
  redis.call('HDEL', KEYS[3], id)
end

if op == 'ack' then
  if not standing(waiting) then return 0 end
  redis.call('ZADD', KEYS[2], string.format('%d', standing(mark) or now), given)
  redis.call('ZREM', KEYS[2], waiting)
  return 1
end

if op == 'peek' then
  if standing(given) then return 5 end
  if standing(waiting) then return 2 end
  return 0
end

if op == 'reason' then
  if not standing(mark) then return '' end
  return string.match(redis.call('HGET', KEYS[3], id) or '', '^%d+ (.*)$') or ''
end

if op == 'show' then
  local ids = gids()
  local until_us = standing(mark)
  local left, outcome = journal()
  local out = {now, until_us or 0, '', left or 0, outcome, n}
  if until_us then out[3] = string.match(redis.call('HGET', KEYS[3], id) or '', '^%d+ (.*)$') or '' end
  local slots = redis.call('ZMSCORE', KEYS[1], unpack(ids))
  for k, g in ipairs(ids) do
    local s = tonumber(slots[k] or nil)
    if s and s < now - dedup then s = nil end
    out[#out + 1] = s or 0
    for _, kind in ipairs({'s', 'd', 'p'}) do out[#out + 1] = standing(g .. '\0' .. kind) or 0 end
  end
  local leases = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. string.format('%d', now), '+inf', 'WITHSCORES')
  for j = 1, #leases, 2 do
    local owner = string.match(leases[j], '^([^%z]*)%z')
    for _, g in ipairs(ids) do
      if owner == g then out[#out + 1], out[#out + 2] = leases[j], tonumber(leases[j + 1]) end
    end
  end
  return out
end

local slot, dup = admission()
if op == 'settle' then
  -- the slot waited on, from the wait's mark (the record may have let the admission go by now)
  local waited = tonumber(redis.call('ZSCORE', KEYS[2], waiting) or nil)
  if waited then slot = waited - tonumber(ARGV[6]) end
  if standing(given) then
    redis.call('ZREM', KEYS[2], given)
    return {5, slot or 0, now}
  end
  lift()
  -- Found to have left: a later cancel says so too, though the record lets the admission go.
  redis.call('HSET', KEYS[3], id .. '\0left', string.format('%d %d', now + tonumber(ARGV[5]), slot or 0))
  return {1, slot or 0, now}
end

-- cancel
if standing(waiting) then return {4, slot or 0, now} end
if standing(mark) then return {3, 0, now} end
if (slot and (slot <= now or dup)) or standing(id .. '\0s') then return {1, slot or 0, now} end
local until_us, left_us = string.match(redis.call('HGET', KEYS[3], id .. '\0left') or '', '^(%d+) (%d+)$')
if tonumber(until_us) and tonumber(until_us) >= now then return {1, tonumber(left_us), now} end
if not slot then
  local left, outcome = journal()
  if left and outcome ~= 'throttled' then return {1, left, now} end
end
local keep = tonumber(ARGV[5])
local ms = math.ceil(keep / 1000) + 1000
redis.call('ZADD', KEYS[2], string.format('%d', now + keep), mark)
if slot then redis.call('ZADD', KEYS[2], string.format('%d', slot + tonumber(ARGV[6])), waiting) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('(%d', now))
if redis.call('PTTL', KEYS[2]) < ms then redis.call('PEXPIRE', KEYS[2], string.format('%d', ms)) end
if redis.call('HLEN', KEYS[3]) > 256 then
  local all = redis.call('HGETALL', KEYS[3])
  for j = 1, #all, 2 do
    if (tonumber(string.match(all[j + 1], '^%d+') or nil) or 0) < now then redis.call('HDEL', KEYS[3], all[j]) end
  end
end
redis.call('HSET', KEYS[3], id, string.format('%d', now + keep) .. ' ' .. ARGV[9])
if redis.call('PTTL', KEYS[3]) < ms then redis.call('PEXPIRE', KEYS[3], string.format('%d', ms)) end
if slot then
  redis.call('PUBLISH', ARGV[7], ARGV[8] .. ' cancel ' .. id)
  return {2, slot, now}
end
return {0, 0, now}
