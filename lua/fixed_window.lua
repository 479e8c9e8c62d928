-- fixed_window.lua: a counter per calendar window; appended to the family, lua/family/, after its
-- counters.lua (see its contract.lua for KEYS[1..3], ARGV and the reply).
--
-- KEYS[4], KEYS[5], ... -> <prefix>:{<provider>}:fw:<W>  HASH  one per policy: window index -> units, where
--                          window k is [k*W, (k+1)*W) µs of the Redis clock: aligned to the Unix epoch, so a
--                          minute starts at :00 and a day at 00:00 UTC, as calendar-counting providers do
--
-- This is INCR + PEXPIRE per window, with the window chosen by the Redis clock: a key computed inside the
-- script could not be declared in KEYS (Redis Cluster), so each window is a field of one hash per policy,
-- set to its new count (HSET), and past windows are deleted as time passes.
--
-- Guarantee: every calendar window of every policy holds at most L units. A window of W across a boundary
-- can hold up to 2*L (L at the end of one window, L at the start of the next): by design, and what a
-- provider that counts calendar windows allows too. The margin m guards the boundary: a slot is never in
-- the last m of a window (a job asking then goes at the next window's start), so a request landing up to m
-- late is still counted by the provider in the window the gate counted it in.
--
-- Reservations: slots are first come, first served (never before the id record's newest slot): the first
-- window, from there on, with room for the job in every policy, at its start. Release and moves take a
-- job's units out of its window's counter while that window is current or ahead (exact).

-- Per call (algo.init, algo.load): keys_of[i], policy i's hash, and its windows as read: ks[i][j], cs[i][j]
-- for j = 1..len[i], window index and units, in no particular order (the current window and those
-- reserved ahead: a scan of a few). The tables live on between a function's calls; only 1..len[i] is this
-- call's. (Indexed by position: a Lua table indexed by window numbers in the tens of millions makes
-- gopher-lua, the demo's embedded Redis, allocate an array that large.)
-- A merchant's policies (the family's S[11]) are policies like the provider's, each with a hash of its
-- own: KEYS[3 + i] -> <prefix>:{<provider>}:m:<merchant>:fw:<W>.
algo.merchants = true
algo.counters = true -- family/record.lua's counted_marker: units go back only into the counters that took them

local keys_of, ks, cs, len = {}, {}, {}, {}

function algo.init()
  for i = 1, P do
    keys_of[i], len[i] = KEYS[3 + i], 0
    if not ks[i] then ks[i], cs[i] = {}, {} end
  end
end

local function window(i, at) return math.floor(at / windows[i]) end

function algo.load(trim)
  for i = 1, P do len[i] = counters_read(keys_of[i], window(i, now), trim, ks[i], cs[i]) end
end

-- find is the position of window k among policy i's, or nil.
local function find(i, k) return counters_find(ks[i], len[i], k) end

local function count(i, k)
  local j = find(i, k)
  if j then return cs[i][j] end
  return 0
end

-- Slots are handed out first come, first served: a later job never goes in an earlier window than one
-- reserved before it (the id record's newest slot is where the search starts).
algo.fcfs = true

function algo.earliest(from, n)
  local slot, blocker = from, nil
  -- Each pass moves the slot to the start of a later window; windows past the last counted one have room.
  -- Past the caller's max wait the answer is a denial whatever the slot: stop there.
  for _ = 1, 100000 do
    if op == 'reserve' and slot - now > arg4 then return slot, blocker, 0 end
    local moved = false
    for i = 1, upto do
      local k = window(i, slot)
      if count(i, k) + n > limits[i] or slot + margin >= (k + 1) * windows[i] then
        slot, blocker, moved = (k + 1) * windows[i], i, true
      end
    end
    if not moved then return slot, blocker, 0 end
  end
  return error('paygate: fixed_window found no window with room')
end

-- add changes window k of policy i by n units, in Lua and (queued) in its hash.
local function add(i, k, n)
  local j = find(i, k)
  local c = n
  if j then c = cs[i][j] + n end
  if c <= 0 then
    write('HDEL', keys_of[i], int(k))
    if j then
      local last = len[i]
      ks[i][j], cs[i][j] = ks[i][last], cs[i][last]
      len[i] = last - 1
    end
  else
    write('HSET', keys_of[i], int(k), int(c))
    if j then
      cs[i][j] = c
    else
      local last = len[i] + 1
      ks[i][last], cs[i][last], len[i] = k, c, last
    end
  end
end

local function last_window(i)
  local k_, last = ks[i], nil
  for j = 1, len[i] do
    if last == nil or k_[j] > last then last = k_[j] end
  end
  return last
end

-- keep sets a hash's expiry to the end of its last window.
local function keep(i)
  expire(keys_of[i], ((last_window(i) + 1) * windows[i] - now) / 1000 + 1000)
end

function algo.commit(slot, n)
  for i = 1, P do
    add(i, window(i, slot), n)
    keep(i)
  end
end

function algo.force() error('paygate: force is only for token_bucket') end

algo.give_back, algo.take_back = counter_undo(window, count, add, keep)

local function room_of(i, at) return math.max(0, limits[i] - count(i, window(i, at))) end

function algo.room(at)
  return tightest(room_of, at)
end

local function reset_of(i)
  local last = last_window(i)
  if last == nil then return 0 end
  return math.max(0, (last + 1) * windows[i] - now)
end

function algo.reset_after()
  local r = 0
  for i = 1, P do r = math.max(r, reset_of(i)) end
  return r
end

function algo.status()
  local out = {}
  for i = 1, P do
    local k = window(i, now)
    local reserved = 0
    for j = 1, len[i] do
      if ks[i][j] > k then reserved = reserved + cs[i][j] end
    end
    out[i] = {count(i, k), reserved, math.max(0, limits[i] - count(i, k)), reset_of(i)}
  end
  return out
end

function algo.save() end

