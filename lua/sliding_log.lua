-- sliding_log.lua: exact sliding-log admission, the default; appended to family.lua (see there for KEYS,
-- ARGV, the reply and the id record).
--
-- The id record KEYS[1] (<prefix>:{<provider>}:log) is the log: one member per unit of cost, score = its
-- slot (algo.per_unit), kept for the longest window plus margin (the driver's dedup, set so by gate.go).
-- No other state, but for a merchant with limits of its own (family.lua's S[10]):
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
-- The driver queues writes: what this file reads from Redis does not show a job being admitted (added) or
-- a moved job's units leaving (removed) in this call, so count and newest correct for them.

algo.fcfs = true
algo.per_unit = true
algo.merchants = true

-- Per call (algo.init): mlog, the merchant's log or nil; W[i], policy i's window plus margin, and the longest
-- (kept in the settings' table: they follow from the settings alone); added, removed: {slot, n} queued in this
-- call; read_at[i], read[i]: the last ZCOUNT of policy i's log, for its window ending at read_at[i] (the
-- tables live on between a function's calls; init empties them).
local mlog, W, longest, added, removed
local read_at, read = {}, {}

function algo.init()
  mlog, added, removed = nil, nil, nil
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
  if removed and removed.slot > at - W[i] and (i <= PP or removed.in_mlog) then c = c - removed.n end
  if added and added.slot > at - W[i] then c = c + added.n end
  return c
end

-- newest_but(log, k) is the score of the (k+1)-th newest member (0-based k) of log, not counting a moved
-- job's units that are leaving: the rare path reads k + n + 1 members.
local function newest_but(log, k)
  if not removed then return tonumber(redis.call('ZREVRANGE', log, k, k, 'WITHSCORES')[2]) end
  local prefix = id .. '\0'
  local got = redis.call('ZREVRANGE', log, 0, k + removed.n, 'WITHSCORES')
  for j = 1, #got, 2 do
    local m, score = got[j], tonumber(got[j + 1])
    local leaving = score == removed.slot and (m == id or string.sub(m, 1, #prefix) == prefix)
    if not leaving then
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

function algo.commit(slot, n) added = {slot = slot, n = n} end

function algo.force() error('paygate: force is only for token_bucket') end

function algo.give_back(slot, n)
  -- In the merchant's log only if it was admitted with its limits in force (they may be new since).
  removed = {slot = slot, n = n, in_mlog = mlog ~= nil and tonumber(redis.call('ZSCORE', mlog, id) or nil) == slot}
  return true
end

function algo.take_back(_) removed = nil end

local function room_of(i, at) return math.max(0, limits[i] - count(i, at)) end

function algo.room(at)
  return tightest(room_of, at)
end

local function newest()
  local tail = newest_slot()
  if added and (not tail or added.slot > tail) then tail = added.slot end
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

-- save keeps the merchant's log in step with KEYS[1]: the units that left it (a release or a move) leave,
-- the job's new ones come in, and what no policy counts any more is trimmed.
function algo.save()
  if not mlog then return end
  if removed then write_members('ZREM', mlog, members_of(removed.n)) end
  if added then
    write_members('ZADD', mlog, members_of(added.n), int(added.slot))
    write('ZREMRANGEBYSCORE', mlog, '-inf', '(' .. int(now - dedup))
    expire(mlog, (math.max(added.slot - now, reset_after()) + dedup) / 1000 + 1000)
  end
end

