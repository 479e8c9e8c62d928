-- sliding_log.lua: exact sliding-log admission, the default; appended to family.lua (see there for KEYS,
-- ARGV, the reply and the id record).
--
-- The id record KEYS[1] (<prefix>:{<provider>}:log) is the log: one member per unit of cost, score = its
-- slot (algo.per_unit), kept for the longest window plus margin (the driver's dedup, set so by gate.go).
-- No other state.
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

local W, longest = {}, 0
for i = 1, P do
  W[i] = windows[i] + margin
  longest = math.max(longest, W[i])
end

local added, removed -- {slot, n}: queued in this call

local cache = {} -- cache[i][at]: ZCOUNT as read (number keys: a µs time is 16 digits, more than tostring keeps)
for i = 1, P do cache[i] = {} end
-- count is the units policy i counts in its window ending at `at`, with any reservations beyond it.
local function count(i, at)
  local c = cache[i][at]
  if not c then
    c = redis.call('ZCOUNT', ids, int(at - W[i] + 1), '+inf')
    cache[i][at] = c
  end
  if removed and removed.slot > at - W[i] then c = c - removed.n end
  if added and added.slot > at - W[i] then c = c + added.n end
  return c
end

-- newest_but(k) is the score of the (k+1)-th newest member (0-based k), not counting a moved job's units
-- that are leaving: the rare path reads k + n + 1 members.
local function newest_but(k)
  if not removed then return tonumber(redis.call('ZREVRANGE', ids, k, k, 'WITHSCORES')[2]) end
  local prefix = id .. '\0'
  local got = redis.call('ZREVRANGE', ids, 0, k + removed.n, 'WITHSCORES')
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
  for i = 1, P do
    if count(i, slot) + n > limits[i] then
      local free_at = newest_but(limits[i] - n) + W[i]
      if free_at > blocker_at then blocker, blocker_at = i, free_at end
      slot = math.max(slot, free_at)
    end
  end
  return slot, blocker, 0
end

function algo.commit(slot, n) added = {slot = slot, n = n} end

function algo.force() error('paygate: force is only for token_bucket') end

function algo.give_back(slot, n)
  removed = {slot = slot, n = n}
  return true
end

function algo.take_back(_) removed = nil end

function algo.room(at)
  return tightest(function(i) return math.max(0, limits[i] - count(i, at)) end)
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
    local counted = count(i, now)
    local reset = 0
    if counted > 0 then reset = math.max(0, tail + W[i] - now) end
    out[i] = {counted - reserved, reserved, math.max(0, limits[i] - counted), reset}
  end
  return out
end

function algo.save() end

return run()
