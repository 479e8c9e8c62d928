-- family/arrivals.lua: the theoretical arrival times of gcra and leaky_bucket (appended only to theirs,
-- after undo.lua, whose store holds them).
--
-- arrival_times is the TAT per policy, kept exactly as q + r/L µs (q whole, 0 <= r < L) in the store (field
-- v:<W µs> = q, v:<W µs>:r = r). T = (W + m) / L is rarely a whole number of µs, and a double at today's
-- clock holds µs only to 0.25: adding T as a double drifts, or rounds a fraction below 1/8 away. With
-- W + m = a*L + b, n*T = n*a + n*b/L is added in whole numbers, exact while n*b < 2^53 (limits below
-- 9.4e7). Only room and status figures, which decide nothing, use doubles.
-- As with the store, a call has one: arrivals() readies it. Its fields: state (the store), T[i] (T as a
-- double), and the functions below. What they read on every use is kept in upvalues, set by arrivals()
-- from the settings' table (conf.arrivals, made once per settings, with T and the store's names):
-- step_whole[i] = a and step_rest[i] = b (n*T = n*a + n*b/L), q_field[i] and r_field[i] (the store's names
-- of q and r).
local arrival_times = {}
local step_whole, step_rest, q_field, r_field
-- tat_q, tat_r: policy i's TAT's q and r (a fractional q is rounded up: the TAT is never early).
local function tat_q(i)
  local x = store.v[q_field[i]] or 0
  if x % 1 ~= 0 then x = math.ceil(x) end
  return x
end
local function tat_r(i) return store.v[r_field[i]] or 0 end
arrival_times.q, arrival_times.r = tat_q, tat_r
function arrival_times.tat(i) return tat_q(i) + tat_r(i) / limits[i] end
-- tat_plus (arrival_times.plus) returns q', r' of (q0 + r0/L) + n*T.
local function tat_plus(i, q0, r0, n)
  local y, l = r0 + n * step_rest[i], limits[i]
  return q0 + n * step_whole[i] + math.floor(y / l), y % l
end
arrival_times.plus = tat_plus
-- ceil_tat is the TAT rounded up to the µs.
function arrival_times.ceil_tat(i)
  if tat_r(i) > 0 then return tat_q(i) + 1 end
  return tat_q(i)
end
-- advance sets TAT = max(TAT, slot) + n*T.
function arrival_times.advance(i, slot, n)
  local q0, r0 = tat_q(i), tat_r(i)
  if slot > q0 or (slot == q0 and r0 == 0) then q0, r0 = slot, 0 end
  local v = store.v
  v[q_field[i]], v[r_field[i]] = tat_plus(i, q0, r0, n)
end
-- arrivals readies arrival_times for the call, over the hash key, and returns it.
local function arrivals(key)
  local c = conf.arrivals
  if not c then
    c = {step_whole = {}, step_rest = {}, T = {}, q_field = {}, r_field = {}, names = {}}
    for i = 1, P do
      local d = windows[i] + margin
      c.step_whole[i], c.step_rest[i], c.T[i] = math.floor(d / limits[i]), d % limits[i], d / limits[i]
      c.q_field[i], c.r_field[i] = int(windows[i]), int(windows[i]) .. ':r'
      c.names[#c.names + 1], c.names[#c.names + 2] = c.q_field[i], c.r_field[i]
    end
    conf.arrivals = c
  end
  arrival_times.T = c.T
  step_whole, step_rest, q_field, r_field = c.step_whole, c.step_rest, c.q_field, c.r_field
  arrival_times.state = undoable(key, c.names)
  return arrival_times
end
