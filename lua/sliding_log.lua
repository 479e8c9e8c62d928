-- sliding_log.lua: paygate's gate. Exact sliding-log admission, with reservations, for one provider.
--
-- KEYS[1] -> <prefix>:{<provider>}:log    ZSET   one member per unit of cost, score = slot time (µs, Redis
--                                                clock): the job id for its first unit, id.."\0"..k for its
--                                                k-th (k >= 2; job ids never contain NUL)
-- KEYS[2] -> <prefix>:{<provider>}:pause  STRING slot time (µs) before which nothing is admitted
-- KEYS[3] -> <prefix>:{<provider>}:sent   HASH   ids whose request was accepted though not settled (sent.lua)
-- KEYS[4] -> <prefix>:{<provider>}:pace   STRING the pace's theoretical arrival time (µs): paced slots are
--                                                at or after it less the burst tolerance (ARGV[8])
-- KEYS[5] -> <prefix>:{<provider>}:epoch  STRING when this provider's state began (µs); never expires (last,
--                                                as in family.lua)
--
-- ARGV[1] -> job id (1..600 bytes, no NUL)
-- ARGV[2] -> cost: integer >= 1 and <= every limit
-- ARGV[3] -> max wait µs: the latest acceptable slot is now + max wait (0: now or never)
-- ARGV[4] -> stale µs: a duplicate whose slot is more than this before now is moved (see below); 0: never
-- ARGV[5] -> warm-up µs: when KEYS[5] is missing (the state was lost, say a Redis restart without
--            persistence, or this is the provider's first decision), the provider is paused this long
--            before anything is admitted; 0: off
-- ARGV[6] -> margin µs, added to every window
-- ARGV[7] -> pace µs per unit of cost (0: not paced): a slot is never before the pace's arrival time KEYS[4]
--            less the tolerance, and an admission of cost c at slot s moves that time to max(it, s) + c * pace
--            (GCRA over slots), so that slots come pace apart rather than a window's worth at one instant
-- ARGV[8] -> tolerance µs: (burst - 1) * pace, how many units may share a moment
-- ARGV[9], ARGV[10] -> limit, window µs of policy 0; ARGV[11], ARGV[12] -> policy 1; and so on
--
-- Returns {allowed, duplicate, delay_us, retry_after_us, remaining, policy, now_us, paused, admitted_us, moved,
--          reset_after_us} (the reply of every algorithm; family.lua gives the others the same)
--   allowed         1: admitted and recorded at slot = now + delay_us. 0: denied, nothing recorded
--   duplicate       1: the id is already in the log; it consumes nothing and goes at its own slot, the
--                   end of a pause, or now, whichever is latest (denied if that is beyond max wait)
--   delay_us        slot - now (>= 0) when allowed, else 0
--   retry_after_us  when denied (> 0): the same call made this much later is admitted if nobody else
--                   takes the room meanwhile; else 0
--   remaining       room left in the tightest policy's window at the slot (after this job), or at now
--                   when denied (counting reservations already handed out); never negative
--   policy          0-based index of the policy that blocks (the one needing the latest slot), or of the
--                   tightest policy when none blocks
--   now_us          Redis TIME in µs: the only clock that enters a decision
--   paused          1 when a provider pause is what sets the slot
--   admitted_us     a duplicate's or moved job's old slot (when its id was admitted), µs; else 0
--   moved           1: the id was in the log at a slot more than stale µs before it would now go (now, or
--                   the end of a pause), and not marked sent. Its earlier delivery may
--                   never have sent its request, so this one is a new request at a new time: its entry
--                   left the log and it was admitted afresh, first come first served, in this one step
--                   (denied: its entry stays where it was). No budget is spent twice, and whichever of
--                   the two requests the provider counts, the log covers: no later slot can precede the
--                   new one, which lies after the old.
--   reset_after_us  time until the log holds nothing any window counts: the newest slot (after this
--                   decision) plus the longest window, less now; 0 when the log is empty
--
-- Invariant: slots are handed out first come, first served (a new slot is never before the newest one), so
-- every entry is at or before the slot being decided, and for every policy (L per W) and every t the log
-- holds at most L members with slot in (t-W-margin, t]. Scores go to redis.call as Lua numbers, which
-- Redis formats exactly; Lua's own tostring would keep only 14 digits of a µs timestamp. Arguments Redis
-- parses as integers (PEXPIRE) are formatted with %d, whatever the server's number formatting.

local log, pause = KEYS[1], KEYS[2]
local id = ARGV[1]
local cost = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local stale = tonumber(ARGV[4])
local warmup = tonumber(ARGV[5])
local margin = tonumber(ARGV[6])
local pace, tolerance = tonumber(ARGV[7]), tonumber(ARGV[8])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local limits, windows, longest = {}, {}, 0
for i = 9, #ARGV, 2 do
  local n = #limits + 1
  limits[n] = tonumber(ARGV[i])
  windows[n] = tonumber(ARGV[i + 1]) + margin
  if cost > limits[n] then
    return redis.error_reply('ERR paygate: cost ' .. ARGV[2] .. ' exceeds limit ' .. ARGV[i])
  end
  if windows[n] > longest then longest = windows[n] end
end

-- What no window can see any more is trimmed on every call.
redis.call('ZREMRANGEBYSCORE', log, '-inf', now - longest)

-- Members counted by policy i in the window ending at `at`, with any reservations beyond it.
local used, used_at = {}, {}
local function count(i, at)
  if used_at[i] ~= at then
    used[i] = redis.call('ZCOUNT', log, at - windows[i] + 1, '+inf')
    used_at[i] = at
  end
  return used[i]
end

local function tightest(at, extra)
  local room, index = nil, 0
  for i = 1, #limits do
    local r = limits[i] - count(i, at) - extra
    if room == nil or r < room then room, index = r, i - 1 end
  end
  return math.max(room, 0), index
end

-- A duplicate holds its permit already: it goes at its own slot, after a pause (a provider's 429 binds
-- redeliveries too), or now, whichever is latest, within max wait like any job.
local pause_until = tonumber(redis.call('GET', pause) or 0)
-- Warm-up: no epoch means the log may have lost what the provider still counts. Hold the provider until
-- nothing admitted or reserved before the loss can share a window with what is admitted after it.
if warmup > 0 and redis.call('SET', KEYS[5], string.format('%d', now), 'NX') then
  if now + warmup > pause_until then
    pause_until = now + warmup
    redis.call('SET', pause, string.format('%d', pause_until), 'PX', string.format('%d', math.ceil(warmup / 1000) + 1000))
  end
end
local prev = redis.call('ZSCORE', log, id)
local function reset_after(newest)
  if not newest then return 0 end
  return math.max(0, newest + longest - now)
end
local units
local moved, old = 0, 0
-- Stale: it would go out more than `stale` after its own slot (now, or the end of a pause in force).
if prev and stale > 0 and math.max(now, pause_until) - tonumber(prev) > stale and redis.call('HEXISTS', KEYS[3], id) == 0 then
  -- Every unit it had at its old slot goes, whatever its cost was then (the rare path: a scan of one slot).
  moved, old = 1, tonumber(prev)
  local gone = {}
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', log, prev, prev)) do
    if m == id or string.sub(m, 1, #id + 1) == id .. '\0' then gone[#gone + 1] = m end
  end
  redis.call('ZREM', log, unpack(gone))
  units = gone -- restored as they were if the fresh admission is denied
elseif prev then
  local at, paused = math.max(tonumber(prev), now), 0
  if pause_until > at then at, paused = pause_until, 1 end
  local room, index = tightest(at, 0)
  local reset = reset_after(tonumber(redis.call('ZREVRANGE', log, 0, 0, 'WITHSCORES')[2]))
  if at - now > max_wait then return {0, 1, 0, at - now - max_wait, room, index, now, paused, tonumber(prev), 0, reset} end
  return {1, 1, at - now, 0, room, index, now, paused, tonumber(prev), 0, reset}
end

-- The earliest slot: not before now, the newest slot (first come, first served) or a pause; and for each
-- policy whose window at the slot has no room for `cost`, late enough that the (L-cost+1)-th newest
-- member has left that window.
local slot = now
local tail = redis.call('ZREVRANGE', log, 0, 0, 'WITHSCORES')[2]
if tail then tail = tonumber(tail); slot = math.max(slot, tail) end
slot = math.max(slot, pause_until)
local tat = 0
if pace > 0 then
  tat = tonumber(redis.call('GET', KEYS[4]) or 0)
  slot = math.max(slot, tat - tolerance)
end
local blocker, blocker_at = nil, now
for i = 1, #limits do
  if count(i, slot) + cost > limits[i] then
    local must_leave = redis.call('ZREVRANGE', log, limits[i] - cost, limits[i] - cost, 'WITHSCORES')[2]
    local free_at = tonumber(must_leave) + windows[i]
    if free_at > blocker_at then blocker, blocker_at = i - 1, free_at end
    slot = math.max(slot, free_at)
  end
end
local paused = 0
if pause_until > now and slot == pause_until then paused = 1 end

local wait = slot - now
if wait > max_wait then
  if moved == 1 then -- denied: the entry goes back where it was
    local args = {}
    for _, m in ipairs(units) do
      args[#args + 1] = old
      args[#args + 1] = m
    end
    redis.call('ZADD', log, unpack(args))
    used_at = {}
    tail = math.max(tail or 0, old)
  end
  local room, index = tightest(now, 0)
  return {0, 0, 0, wait - max_wait, room, blocker or index, now, paused, old, 0, reset_after(tail)}
end

local room, index = tightest(slot, cost)
local args = {slot, id}
for k = 2, cost do
  args[#args + 1] = slot
  args[#args + 1] = id .. '\0' .. k
end
redis.call('ZADD', log, unpack(args))
redis.call('PEXPIRE', log, string.format('%d', math.ceil((wait + longest) / 1000) + 1000))
if pace > 0 then
  tat = math.max(tat, slot) + cost * pace
  redis.call('SET', KEYS[4], string.format('%d', tat), 'PX', string.format('%d', math.ceil((tat - now) / 1000) + 1000))
end
return {1, 0, wait, 0, room, blocker or index, now, paused, old, moved, reset_after(slot)}
