-- sliding_window.lua: counters in sub-windows; appended to the family, lua/family/, after its counters.lua
-- (see its contract.lua for KEYS[1..3], ARGV and the reply).
--
-- KEYS[4], KEYS[5], ... -> <prefix>:{<provider>}:sw:<g>  HASH  one per policy: bucket index -> units, where
--                          a bucket is g = ceil((W + m) / B) µs of the Redis clock (index = floor(t / g)),
--                          B = S[3]; named by g, so a change of window, margin or B starts afresh
--
-- Memory is O(B) per policy: a decision reads the B + 1 buckets that can still count, plus buckets of
-- reservations ahead, and deletes older ones.
--
-- Exactness: a job at slot s in bucket k is admitted when every unit in buckets k - B .. (and any bucket
-- after k) plus its cost fits the limit L. Those buckets cover at least (s - W - m, s], so the units in
-- any window of W + m never exceed L: never more than sliding_log admits. They cover at most
-- (s - W - m - g, s], so a job is admitted wherever an exact log over W + m + g would admit it: the worst
-- case error against the exact log is one bucket of time, that is L per W + m + g instead of L per W + m
-- under steady overload (B/(B+1) of the budget with m = 0; 90.9% at B = 10).
--
-- Reservations: slots are first come, first served without reading the id record: a bucket's count sums
-- every bucket from k - B on, later ones (reservations) included, so no job finds room before a slot
-- already reserved. That sum only falls as k grows, so the earliest slot is the start of the first bucket
-- where enough units have left: found in one pass over the buckets.
--
-- Release and moves take a job's units out of the bucket they went into while it still counts (exact).

-- A merchant's policies (the family's S[11]) are policies like the provider's, each with a hash of its
-- own: KEYS[3 + i] -> <prefix>:{<provider>}:m:<merchant>:sw:<g>.
algo.merchants = true
algo.counters = true -- family/record.lua's counted_marker: units go back only into the counters that took them

-- Per call (algo.init, algo.load): g[i], policy i's bucket (µs; kept in the settings' table), keys_of[i] its
-- hash, and its buckets as read: ks[i][j], cs[i][j] for j = 1..len[i], bucket index and units, in no
-- particular order (a policy has B + 1 that count and those reserved ahead: scanning them is cheaper than
-- keeping them sorted). The tables live on between a function's calls; only 1..len[i] is this call's.
local g
local keys_of, ks, cs, len = {}, {}, {}, {}

function algo.init()
  g = conf.sw_g
  if not g then
    g = {}
    for i = 1, P do g[i] = math.ceil((windows[i] + margin) / buckets) end
    conf.sw_g = g
  end
  for i = 1, P do
    keys_of[i], len[i] = KEYS[3 + i], 0
    if not ks[i] then ks[i], cs[i] = {}, {} end
  end
end

local function bucket(i, at) return math.floor(at / g[i]) end

function algo.load(trim)
  for i = 1, P do len[i] = counters_read(keys_of[i], bucket(i, now) - buckets, trim, ks[i], cs[i]) end
end

-- units of policy i in buckets from index k on
local function from_bucket(i, k)
  local k_, c_, sum = ks[i], cs[i], 0
  for j = 1, len[i] do
    if k_[j] >= k then sum = sum + c_[j] end
  end
  return sum
end

-- find is the position of bucket k among policy i's, or nil.
local function find(i, k) return counters_find(ks[i], len[i], k) end

-- newest is policy i's newest bucket index, or nil.
local function newest(i)
  local k_, last = ks[i], nil
  for j = 1, len[i] do
    if not last or k_[j] > last then last = k_[j] end
  end
  return last
end

function algo.earliest(from, n)
  local slot, blocker = from, nil
  for i = 1, upto do
    local k0 = bucket(i, from)
    local sum = from_bucket(i, k0 - buckets)
    if sum + n > limits[i] then
      -- The buckets from k0 - B on, oldest first (a few: an insertion sort).
      local k_, c_, sk, sc, m = ks[i], cs[i], {}, {}, 0
      for j = 1, len[i] do
        local k = k_[j]
        if k >= k0 - buckets then
          local at = m + 1
          while at > 1 and sk[at - 1] > k do
            sk[at], sc[at] = sk[at - 1], sc[at - 1]
            at = at - 1
          end
          sk[at], sc[at], m = k, c_[j], m + 1
        end
      end
      for j = 1, m do
        sum = sum - sc[j]
        if sum + n <= limits[i] then
          local s = (sk[j] + buckets + 1) * g[i]
          if s > slot then slot, blocker = s, i end
          break
        end
      end
    end
  end
  return slot, blocker, 0
end

-- add changes bucket k of policy i by n units, in Lua and (queued) in its hash.
local function add(i, k, n)
  local j = find(i, k)
  if j then
    local c = cs[i][j] + n
    if c <= 0 then
      write('HDEL', keys_of[i], int(k))
      local last = len[i]
      ks[i][j], cs[i][j] = ks[i][last], cs[i][last]
      len[i] = last - 1
    else
      write('HSET', keys_of[i], int(k), int(c))
      cs[i][j] = c
    end
    return
  end
  if n <= 0 then return end
  write('HSET', keys_of[i], int(k), int(n))
  local last = len[i] + 1
  ks[i][last], cs[i][last], len[i] = k, n, last
end

-- keep sets a hash's expiry to when its newest bucket stops counting (the expiry only grows: no bucket is
-- added after the newest but by a later slot).
local function keep(i)
  expire(keys_of[i], ((newest(i) + buckets + 1) * g[i] - now) / 1000 + 1000)
end

function algo.commit(slot, n)
  for i = 1, P do
    add(i, bucket(i, slot), n)
    keep(i)
  end
end

function algo.force() error('paygate: force is only for token_bucket') end

local function count(i, k)
  local j = find(i, k)
  if j then return cs[i][j] end
  return 0
end

algo.give_back, algo.take_back = counter_undo(bucket, count, add, keep)

local function room_of(i, at) return math.max(0, limits[i] - from_bucket(i, bucket(i, at) - buckets)) end

function algo.room(at)
  return tightest(room_of, at)
end

local function reset_of(i)
  local last = newest(i)
  if not last then return 0 end
  return math.max(0, (last + buckets + 1) * g[i] - now)
end

function algo.reset_after()
  local r = 0
  for i = 1, P do r = math.max(r, reset_of(i)) end
  return r
end

function algo.status()
  local out = {}
  for i = 1, P do
    local k = bucket(i, now)
    local counted, reserved = from_bucket(i, k - buckets), from_bucket(i, k + 1)
    out[i] = {counted - reserved, reserved, math.max(0, limits[i] - counted), reset_of(i)}
  end
  return out
end

function algo.save() end
