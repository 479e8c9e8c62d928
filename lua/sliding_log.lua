-- sliding_log.lua: exact sliding-log admission, the default; appended to the family, lua/family/ (see its
-- contract.lua for KEYS, ARGV, the reply and the id record).
--
-- The id record KEYS[1] (<prefix>:{<provider>}:log) is the log: one member per unit of cost, score = its
-- slot (algo.per_unit), kept for the longest window plus margin (the driver's dedup, set so by gate.go).
-- No other state, but for a merchant with limits of its own (the family's S[11]):
--
-- KEYS[4] -> <prefix>:{<provider>}:m:<merchant>:log  ZSET  the merchant's log: the same members, at the same
--            slots, as its jobs have in KEYS[1], trimmed alike; its policies count it as the provider's count
--            KEYS[1]. Every member of it is also in KEYS[1], so first come, first served holds for it too.
--
-- Invariant: slots are handed out first come, first served (a new slot is never before the newest one), so
-- every entry is at or before the slot being decided, and for every policy (L per W) and every t the log
-- holds at most L members with slot in (t - W - margin, t]. The earliest slot for a job of cost n is, for
-- each policy whose window at the slot has no room, the moment the (L - n + 1)-th newest member leaves it.
--
-- Work: a decision is a few O(log N) counts and rank lookups, plus O(n) to write a job of cost n; memory is
-- one member per unit in the longest window. gate.MaxSlidingLogLimit bounds every limit for this reason.
--
-- The driver queues writes: what this file reads from Redis does not show the jobs admitted (added) or a
-- moved job's units leaving (removed) in this call, a batch's included, so count, newest_but and newest
-- correct for them. First come, first served, this call's admissions are newer than anything in the log,
-- and come in order of slot.

algo.fcfs = true
algo.per_unit = true
algo.merchants = true

-- Per call (algo.init): mlog, the merchant's log or nil; W[i], policy i's window plus margin, and the longest
-- (kept in the settings' table: they follow from the settings alone); the call's admissions in order of
-- slot, the j-th (j = 1..na) at slot as[j], of an[j] units, asum[j] the units of the first j; removed: the
-- moves' units leaving, {slot, n, id, in_mlog}; read_at[i], read[i]: the last ZCOUNT of policy i's log, for
-- its window ending at read_at[i] (the tables live on between a function's calls; init empties them, or
-- sets na to 0).
local mlog, W, longest, na
local mlog_score -- in_mlog_at's: the job's score in the merchant's log, read once a call (false: not there)
local as, an, asum, removed = {}, {}, {}, {}
local read_at, read = {}, {}

function algo.init()
  mlog, na, mlog_score = nil, 0, nil
  if #removed > 0 then removed = {} end
  if M > 0 then mlog = KEYS[4] end
  if not conf.sl_W then
    local w, l = {}, 0
    for i = 1, P do
      w[i] = windows[i] + margin
      l = math.max(l, w[i])
    end
    conf.sl_W, conf.sl_longest = w, l
  end
  W, longest = conf.sl_W, conf.sl_longest
  for i = 1, P do read_at[i] = nil end
end

-- log_of is the log policy i counts.
local function log_of(i)
  if i > PP then return mlog end
  return ids
end

-- in_mlog_at tells whether the job is in the merchant's log at slot (admitted with its merchant's limits in
-- force; they may be new since). A merchant's job is decided alone, so the one read serves the call.
local function in_mlog_at(slot)
  if not mlog then return false end
  if mlog_score == nil then mlog_score = tonumber(redis.call('ZSCORE', mlog, id) or nil) or false end
  return mlog_score == slot
end

-- added_since is the units of the call's admissions with a slot after t.
local function added_since(t)
  local k = na
  if k == 0 or as[k] <= t then return 0 end
  if as[1] > t then return asum[k] end -- the common case: the call's admissions are all in the window
  local lo, hi = 1, k -- the first admission after t: the admissions are in order of slot
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if as[mid] > t then hi = mid else lo = mid + 1 end
  end
  return asum[k] - (lo > 1 and asum[lo - 1] or 0)
end

-- count is the units policy i counts in its window ending at `at`, with any reservations beyond it.
local function count(i, at)
  local c
  if read_at[i] == at then
    c = read[i]
  else
    local log = ids
    if i > PP then log = mlog end
    c = redis.call('ZCOUNT', log, int(at - W[i] + 1), '+inf')
    read_at[i], read[i] = at, c
  end
  for j = 1, #removed do
    local x = removed[j]
    if x.slot > at - W[i] and (i <= PP or x.in_mlog) then c = c - x.n end
  end
  return c + added_since(at - W[i])
end

-- leaving tells whether member m at score is one of the moves' units leaving in this call.
local function leaving(m, score)
  for _, x in ipairs(removed) do
    if score == x.slot and (m == x.id or string.sub(m, 1, #x.id + 1) == x.id .. '\0') then return true end
  end
  return false
end

-- newest_but(log, k) is the score of the (k+1)-th newest unit (0-based k) of log with the call's admissions
-- (the newest), not counting the moves' units leaving: that rare path reads k + their units + 1 members.
local function newest_but(log, k)
  local j = na
  if j > 0 and k < asum[j] then
    -- one of the call's: the last admission whose units before it (asum[lo - 1]) are fewer than want, the
    -- units from the (k+1)-th newest on
    local want, lo, hi = asum[j] - k, 1, j
    while lo < hi do
      local mid = math.floor((lo + hi + 1) / 2)
      if (mid > 1 and asum[mid - 1] or 0) < want then lo = mid else hi = mid - 1 end
    end
    return as[lo]
  end
  if j > 0 then k = k - asum[j] end
  if #removed == 0 then return tonumber(redis.call('ZREVRANGE', log, k, k, 'WITHSCORES')[2]) end
  local n = 0
  for _, x in ipairs(removed) do n = n + x.n end
  local got = redis.call('ZREVRANGE', log, 0, k + n, 'WITHSCORES')
  for j2 = 1, #got, 2 do
    local m, score = got[j2], tonumber(got[j2 + 1])
    if not leaving(m, score) then
      if k == 0 then return score end
      k = k - 1
    end
  end
  return nil
end

function algo.load(_) end

function algo.earliest(from, n)
  local slot, blocker, blocker_at = from, nil, 0
  for i = 1, upto do
    if count(i, slot) + n > limits[i] then
      local free_at = newest_but(log_of(i), limits[i] - n) + W[i]
      if free_at > blocker_at then blocker, blocker_at = i, free_at end
      slot = math.max(slot, free_at)
    end
  end
  return slot, blocker, 0
end

-- commit adds the admission in order of slot (first come, first served: at the end, but for a slot
-- before the last, which the invariant rules out and which this keeps correct all the same).
function algo.commit(slot, n)
  local j = na + 1
  while j > 1 and as[j - 1] > slot do
    as[j], an[j] = as[j - 1], an[j - 1]
    j = j - 1
  end
  as[j], an[j], na = slot, n, na + 1
  for k = j, na do asum[k] = (k > 1 and asum[k - 1] or 0) + an[k] end
end

function algo.force() error('paygate: force is only for token_bucket') end

function algo.give_back(slot, n)
  -- In the merchant's log only if it was admitted with its limits in force (they may be new since).
  removed[#removed + 1] = {slot = slot, n = n, id = id, in_mlog = in_mlog_at(slot)}
  return true
end

function algo.take_back(_) removed[#removed] = nil end

local function room_of(i, at) return math.max(0, limits[i] - count(i, at)) end

function algo.room(at)
  return tightest(room_of, at)
end

local function newest()
  local tail = newest_slot()
  if na > 0 and (not tail or as[na] > tail) then tail = as[na] end
  return tail
end

function algo.reset_after()
  local tail = newest()
  if not tail then return 0 end
  return math.max(0, tail + longest - now)
end

function algo.status()
  local out, tail = {}, newest()
  local reserved = redis.call('ZCOUNT', ids, int(now + 1), '+inf')
  for i = 1, P do
    if i == PP + 1 then
      reserved = redis.call('ZCOUNT', mlog, int(now + 1), '+inf')
      tail = tonumber(redis.call('ZREVRANGE', mlog, 0, 0, 'WITHSCORES')[2] or nil) or now
    end
    local counted = count(i, now)
    local reset = 0
    if counted > 0 then reset = math.max(0, tail + W[i] - now) end
    out[i] = {counted - reserved, reserved, math.max(0, limits[i] - counted), reset}
  end
  return out
end

-- fits_late: every window (t - W[i], t] the move adds the units to ends at t >= slot + W[i] (else it held
-- them already) and before at + W[i] (else it cannot hold at), so lies within (slot, at + W[i]): a count of
-- that span with room for n is enough. Reservations reach less than a window ahead in the usual case (a
-- backlog at the rate), and the span then holds fewer than the limit.
function algo.fits_late(slot, at, n)
  if mlog and not in_mlog_at(slot) then return false end -- admitted before its merchant's limits: not counted there
  for i = 1, P do
    if redis.call('ZCOUNT', log_of(i), '(' .. int(slot), '(' .. int(at + W[i])) + n > limits[i] then return false end
  end
  return true
end

-- depart moves the job's units in the merchant's log too, when they are there at slot (admitted with its
-- limits in force), and keeps the log until the new slot plus dedup.
function algo.depart(slot, at, members)
  if not in_mlog_at(slot) then return end
  write_members('ZADD', mlog, members, int(at))
  keep_until(mlog, at + dedup)
end

-- save cuts the log to its cap (S[3], when there is one: the newest only), and keeps the merchant's log in
-- step with KEYS[1]: the units that left it (a release or a move) leave,
-- the job's new ones come in, and what no policy counts any more is trimmed. A merchant's job is decided
-- alone (no batch), so removed and the admissions hold its own entries, at most one each.
function algo.save()
  if buckets > 0 and na > 0 then write('ZREMRANGEBYRANK', ids, 0, int(-(buckets + 1))) end -- S[3]: the cap
  if not mlog then return end
  local out = removed[1]
  if out then write_members('ZREM', mlog, members_of(out.n)) end
  if na > 0 then
    write_members('ZADD', mlog, members_of(an[1]), int(as[1]))
    write('ZREMRANGEBYSCORE', mlog, '-inf', '(' .. int(now - dedup))
    expire(mlog, (math.max(as[1] - now, reset_after()) + dedup) / 1000 + 1000)
  end
end

