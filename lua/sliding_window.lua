-- sliding_window.lua: counters in sub-windows; appended to family.lua (see there for KEYS[1..3], ARGV and the
-- reply).
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

-- A merchant's policies (family.lua's S[10]) are policies like the provider's, each with a hash of its
-- own: KEYS[3 + i] -> <prefix>:{<provider>}:m:<merchant>:sw:<g>.
algo.merchants = true

local g, keys_of, counts -- per call (algo.init)

function algo.init()
  g, keys_of, counts = {}, {}, {}
  for i = 1, P do
    g[i] = math.ceil((windows[i] + margin) / buckets)
    keys_of[i] = KEYS[3 + i]
  end
end

local function bucket(i, at) return math.floor(at / g[i]) end

-- counts[i] is a sorted list of {index, units}.
function algo.load(trim)
  for i = 1, P do
    local list, drop = {}, {}
    local first = bucket(i, now) - buckets
    for idx, c in pairs(hash_pairs(redis.call('HGETALL', keys_of[i]))) do
      local k = tonumber(idx)
      if trim and k < first then drop[#drop + 1] = idx else list[#list + 1] = {k, tonumber(c)} end
    end
    write_members('HDEL', keys_of[i], drop) -- split: thousands may have piled up
    table.sort(list, function(a, b) return a[1] < b[1] end)
    counts[i] = list
  end
end

-- units of policy i in buckets from index k on
local function from_bucket(i, k)
  local sum = 0
  for _, e in ipairs(counts[i]) do
    if e[1] >= k then sum = sum + e[2] end
  end
  return sum
end

function algo.earliest(from, n)
  local slot, blocker = from, nil
  for i = 1, upto do
    local k0 = bucket(i, from)
    local sum = from_bucket(i, k0 - buckets)
    if sum + n > limits[i] then
      for _, e in ipairs(counts[i]) do
        if e[1] >= k0 - buckets then
          sum = sum - e[2]
          if sum + n <= limits[i] then
            local s = (e[1] + buckets + 1) * g[i]
            if s > slot then slot, blocker = s, i end
            break
          end
        end
      end
    end
  end
  return slot, blocker, 0
end

-- add changes bucket k of policy i by n units, in Lua and (queued) in its hash.
local function add(i, k, n)
  for j, e in ipairs(counts[i]) do
    if e[1] == k then
      local c = e[2] + n
      if c <= 0 then
        write('HDEL', keys_of[i], int(k))
        table.remove(counts[i], j)
      else
        write('HSET', keys_of[i], int(k), int(c))
        e[2] = c
      end
      return
    end
  end
  if n <= 0 then return end
  write('HSET', keys_of[i], int(k), int(n))
  table.insert(counts[i], {k, n})
  table.sort(counts[i], function(a, b) return a[1] < b[1] end)
end

-- keep sets a hash's expiry to when its newest bucket stops counting (the expiry only grows: no bucket is
-- added after the newest but by a later slot).
local function keep(i)
  expire(keys_of[i], ((counts[i][#counts[i]][1] + buckets + 1) * g[i] - now) / 1000 + 1000)
end

function algo.commit(slot, n)
  for i = 1, P do
    add(i, bucket(i, slot), n)
    keep(i)
  end
end

function algo.force() error('paygate: force is only for token_bucket') end

-- count is the units bucket k of policy i holds.
local function count(i, k)
  for _, e in ipairs(counts[i]) do
    if e[1] == k then return e[2] end
  end
  return 0
end

algo.give_back, algo.take_back = counter_undo(bucket, count, add, keep)

local function room_of(i, at) return math.max(0, limits[i] - from_bucket(i, bucket(i, at) - buckets)) end

function algo.room(at)
  return tightest(room_of, at)
end

local function reset_of(i)
  local last = counts[i][#counts[i]]
  if not last then return 0 end
  return math.max(0, (last[1] + buckets + 1) * g[i] - now)
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

