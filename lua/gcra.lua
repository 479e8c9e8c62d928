-- gcra.lua: the generic cell rate algorithm, burst = limit per window; appended to the family, lua/family/,
-- after its undo.lua and arrivals.lua (see its contract.lua for KEYS[1..3], ARGV and the reply).
--
-- KEYS[4] -> <prefix>:{<provider>}:gcra:<limits> HASH   the policy's theoretical arrival time TAT = q + r/L µs, kept
--                                                exactly: v:<window µs> = q (whole µs), v:<window µs>:r = r
--                                                (0 <= r < L); last, last_slot, u:*: the undo record of the
--                                                newest admission (family/undo.lua's store)
--            <limits> hashes the limits and the live limits' version (gate.keysFor): a change of
--            limits, configured or live, starts the state afresh, and the epoch's warm-up with it
--
-- Per policy (limit L, window W, margin m): emission interval T = (W + m) / L µs per unit. A job of cost n
-- may go at s when max(TAT, s) + n*T - s <= W, and then TAT = max(TAT, s) + n*T. With m = 0 that is the
-- textbook GCRA with a burst of L (go-redis/redis_rate's): any interval of length d holds at most
-- L + d*L/W units. With a margin the rate is L per W+m and the burst L*W/(W+m): slots then hold at most
-- L*W/(W+m) + d*L/(W+m) units in any interval of length d, so requests landing up to m late hold at most
-- L*W/(W+m) + (d+m)*L/(W+m) = L + d*L/(W+m) <= L + d*L/W there: within a provider's bucket of L per W.
-- A job whose n*T exceeds W (n close to L with a margin) goes when the bucket is full.
--
-- Reservations are the TAT running ahead of now: the slot is the earliest s that satisfies every policy.
-- The bound above holds for slots in any order, so no queue tail is kept; the id record serves duplicates
-- and moves.
-- Release (and a move) restores the TATs exactly when the job is the newest admission; otherwise its
-- units stay spent until they drain (never more than the limit).
--
-- Exact arithmetic: the TAT is kept as q + r/L (family/arrivals.lua): adding T as a double drifts (-1/12
-- µs per unit at 3/1ms). Every admission decision is made on whole numbers.

local arr, state, T, q, r, tat, plus -- per call (algo.init)

function algo.init()
  arr = arrivals(KEYS[4])
  state, T = arr.state, arr.T
  q, r, tat, plus = arr.q, arr.r, arr.tat, arr.plus
end

-- fits reports n*T <= W, exactly.
local function fits(i, n)
  local whole, frac = plus(i, 0, 0, n)
  return whole < windows[i] or (whole == windows[i] and frac == 0)
end

function algo.load(_) state.load() end

-- A job of cost n may go at s when max(TAT, s) + n*T - s <= W: at or after TAT + n*T - W (rounded up to
-- the µs), or, when n*T > W, at or after the TAT itself.
function algo.earliest(from, n)
  local slot, blocker = from, nil
  for i = 1, P do
    local s
    if fits(i, n) then
      local whole, frac = plus(i, q(i), r(i), n)
      s = whole - windows[i]
      if frac > 0 then s = s + 1 end
    else
      s = arr.ceil_tat(i)
    end
    if s > slot then slot, blocker = s, i end
  end
  return slot, blocker, 0
end

function algo.commit(slot, n)
  state.begin(slot)
  for i = 1, P do arr.advance(i, slot, n) end
end

function algo.force() error('paygate: force is only for token_bucket') end

function algo.give_back(slot, _) return state.give_back(slot) end
function algo.take_back(token) state.take_back(token) end

-- Room: whole units a job could take at `at` (the bucket's tokens).
local function tokens(i, at) return (windows[i] - math.max(0, tat(i) - at)) / T[i] end

local function room_of(i, at) return math.max(0, math.floor(tokens(i, at) + EPS)) end

function algo.room(at)
  return tightest(room_of, at)
end

function algo.reset_after()
  local m = 0
  for i = 1, P do m = math.max(m, tat(i) - now) end
  return m
end

function algo.status()
  local out = {}
  for i = 1, P do
    local level = math.ceil(math.max(0, tat(i) - now) / T[i] - EPS)
    local used = math.min(limits[i], level)
    local room = math.max(0, math.floor(tokens(i, now) + EPS))
    out[i] = {used, level - used, room, math.max(0, math.ceil(tat(i) - now))}
  end
  return out
end

function algo.save() state.save(reset_after() / 1000 + 1000) end

