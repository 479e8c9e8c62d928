-- token_bucket.lua: a bucket of `limit` tokens per policy, refilled `limit` per window; appended to the
-- family, lua/family/, after its undo.lua (see its contract.lua for KEYS[1..3], ARGV and the reply).
--
-- KEYS[4] -> <prefix>:{<provider>}:tb:<limits> HASH   v:ts = the moment (µs) the tokens are counted at: the newest
--                                                slot, which may lie ahead; v:<window µs> = that policy's
--                                                tokens at v:ts (a fraction); last, last_slot, u:*: the undo
--                                                record of the newest admission (family/undo.lua's store)
--            <limits> hashes the limits and the live limits' version (gate.keysFor): a change of
--            limits, configured or live, starts the state afresh, and the epoch's warm-up with it
--
-- Per policy (limit L, window W, margin m): capacity C = L*W/(W+m) tokens, refilled at r = L/(W+m) per µs
-- (with m = 0: L tokens, L per W). A job of cost n takes n tokens at the earliest slot every policy has them
-- (a job costing more than C waits for a full bucket and leaves it in debt). Any interval of length d then
-- holds at most C + d*r units, and requests that land up to m late at most L + d*L/(W+m): within a
-- provider's bucket of L per W (see gcra.lua, which admits the same). A burst of L at once is by design.
--
-- Reservations: slots are first come, first served. The tokens are counted at the newest slot (v:ts), so a
-- reservation is the bucket drawn ahead of now, and the next job's slot is at or after it.
--
-- Force (ARGV[6] = 1): admitted now whatever the tokens, taking what there is: each policy's bucket drains
-- to zero and never into debt, so later callers wait no longer than for an empty bucket. A forced call can
-- exceed the provider's limit by its cost; a pause still holds it (the family).
--
-- Release (and a move) restores the bucket exactly when the job is the newest admission; otherwise its
-- tokens stay taken until they refill (never more than the limit).

local caps, rates, names, state -- per call (algo.init)

function algo.init()
  if not conf.tb then
    local c = {caps = {}, rates = {}, names = {'ts'}}
    for i = 1, P do
      c.caps[i] = limits[i] * windows[i] / (windows[i] + margin)
      c.rates[i] = limits[i] / (windows[i] + margin)
      c.names[i + 1] = int(windows[i])
    end
    conf.tb = c
  end
  caps, rates, names = conf.tb.caps, conf.tb.rates, conf.tb.names
  state = undoable(KEYS[4], names)
end

local function ts() return state.v.ts or 0 end
local function field(i) return names[i + 1] end
local function stored(i) return state.v[field(i)] or caps[i] end

-- tokens of policy i at `at`: refilled up to the capacity after ts; before ts (reservations ahead), what
-- they will be at ts less the refill still to come. (ts() and stored(i), read once.)
local function tokens(i, at)
  local v = state.v
  local t, have = v.ts or 0, v[names[i + 1]] or caps[i]
  if at >= t then return math.min(caps[i], have + (at - t) * rates[i]) end
  return have - (t - at) * rates[i]
end

function algo.load(_) state.load() end

function algo.earliest(from, n)
  local base = math.max(from, ts())
  local slot, blocker = base, nil
  for i = 1, P do
    local need, have = math.min(n, caps[i]), tokens(i, base)
    if have + EPS < need then
      local s = base + math.ceil((need - have) / rates[i] - EPS)
      if s > slot then slot, blocker = s, i end
    end
  end
  return slot, blocker, 0
end

function algo.commit(slot, n)
  state.begin(slot)
  for i = 1, P do state.v[field(i)] = tokens(i, slot) - n end
  state.v.ts = slot
end

function algo.force(at, n)
  state.begin(at)
  if at >= ts() then
    for i = 1, P do state.v[field(i)] = tokens(i, at) end
    state.v.ts = at
  end
  for i = 1, P do
    local have = stored(i)
    state.v[field(i)] = have - math.min(n, math.max(0, have))
  end
end

function algo.give_back(slot, _) return state.give_back(slot) end
function algo.take_back(token) state.take_back(token) end

local function room_of(i, at) return math.max(0, math.floor(tokens(i, at) + EPS)) end

function algo.room(at)
  return tightest(room_of, at)
end

local function full_after(i)
  local base = math.max(now, ts())
  return base + (caps[i] - tokens(i, base)) / rates[i] - now
end

function algo.reset_after()
  local r = 0
  for i = 1, P do r = math.max(r, full_after(i)) end
  return r
end

function algo.status()
  local out = {}
  for i = 1, P do
    local level = math.max(0, math.ceil(caps[i] - tokens(i, now) - EPS))
    local used = math.min(limits[i], level)
    out[i] = {used, level - used, math.max(0, math.floor(tokens(i, now) + EPS)), math.max(0, math.ceil(full_after(i)))}
  end
  return out
end

function algo.save() state.save(reset_after() / 1000 + 1000) end

