-- leaky_bucket.lua: a queue of `limit` units per policy leaking at `limit` per window; appended to the
-- family, lua/family/, after its undo.lua and arrivals.lua (see its contract.lua for KEYS[1..3], ARGV and
-- the reply).
--
-- KEYS[4] -> <prefix>:{<provider>}:leaky:<limits> HASH   when that policy's queue has drained (its theoretical
--                                                arrival time), exactly: v:<window µs> whole µs, v:<window
--                                                µs>:r the fraction's numerator over L
--                                                (family/arrivals.lua); last, last_slot, u:*: the undo
--                                                record
--            <limits> hashes the limits and the live limits' version (gate.keysFor): a change of
--            limits, configured or live, starts the state afresh, and the epoch's warm-up with it
--
-- Per policy (limit L, window W, margin m): one unit leaks every T = (W + m) / L µs. A job of cost n joins
-- the tail of every policy's queue and goes when it reaches the head: slot = the latest TAT (or now), and
-- then TAT = slot + n*T. It is admitted only if every policy's queue has room for it: (slot - now) + n*T <=
-- L*T, a capacity of L units (with several policies the job waits in all of them at once, so a long wait
-- set by a slow policy can overflow a short policy's queue); a full queue is a denial whatever the max wait,
-- with retry_after_us the time until it has room (a max wait of 0 admits only into an empty queue). The
-- verdict names the policy that sets the slot, else the one whose queue is full.
--
-- Output is smoothed, never a burst: jobs of cost 1 go at least T apart, so any window of W + m holds at most
-- L of them and requests landing up to m late fit a sliding window of L per W (as sliding_log's do) as
-- well as a leaky bucket of L per W. A job of cost n is n units at one moment followed by n*T of silence:
-- with costs above 1 a window of W can hold up to L + n - 1 units.
--
-- Release (and a move) restores the queue exactly when the job is the newest admission (the tail);
-- otherwise its units stay queued until they leak (never more than the limit).

local arr, state, T, tat -- per call (algo.init): the TAT kept exactly as q + r/L (see family/arrivals.lua)

function algo.init()
  arr = arrivals(KEYS[4])
  state, T, tat = arr.state, arr.T, arr.tat
end

function algo.load(_) state.load() end

function algo.earliest(from, n)
  local slot, blocker = from, nil
  for i = 1, P do
    local s = arr.ceil_tat(i)
    if s > slot then slot, blocker = s, i end
  end
  -- Every policy's queue must hold the job: its wait plus its own drain within L*T, that is
  -- slot - now <= (L - n)*T; over is by how much (whole µs: ceil(whole - fraction) = whole).
  local hold, full = 0, nil
  for i = 1, P do
    local over = slot - now - arr.plus(i, 0, 0, limits[i] - n)
    if over > hold then hold, full = over, i end
  end
  return slot, blocker or full, hold
end

function algo.commit(slot, n)
  state.begin(slot)
  for i = 1, P do arr.advance(i, slot, n) end
end

function algo.force() error('paygate: force is only for token_bucket') end

function algo.give_back(slot, _) return state.give_back(slot) end
function algo.take_back(token) state.take_back(token) end

-- Room: whole units the queue can still take at `at`.
local function room(i, at) return limits[i] - math.max(0, tat(i) - at) / T[i] end

local function room_of(i, at) return math.max(0, math.floor(room(i, at) + EPS)) end

-- The verdict's remaining is the queue's room now (after this job), wherever the job's slot is.
function algo.room(_)
  return tightest(room_of, now)
end

function algo.reset_after()
  local r = 0
  for i = 1, P do r = math.max(r, tat(i) - now) end
  return r
end

function algo.status()
  local out = {}
  for i = 1, P do
    local queued = math.max(0, math.ceil((tat(i) - now) / T[i] - EPS))
    local used = math.min(limits[i], queued)
    out[i] = {used, queued - used, math.max(0, math.floor(room(i, now) + EPS)), math.max(0, math.ceil(tat(i) - now))}
  end
  return out
end

function algo.save() state.save(reset_after() / 1000 + 1000) end

