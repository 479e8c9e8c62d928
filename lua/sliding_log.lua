-- sliding_log.lua: paygate's gate. Exact sliding-log admission, with reservations, for one provider.
--
-- KEYS[1] -> <prefix>:{<provider>}:log    ZSET   member = job id, score = slot time (µs, Redis clock)
-- KEYS[2] -> <prefix>:{<provider>}:cum    ZSET   member = job id, score = running total of cost up to and
--                                                including that job; member "" (never a job id) holds the
--                                                total of everything already trimmed, at rank 0
-- KEYS[3] -> <prefix>:{<provider>}:pause  STRING slot time (µs) before which nothing is admitted
--
-- ARGV[1] -> job id (1..128 bytes)
-- ARGV[2] -> cost: integer >= 1 and <= every limit
-- ARGV[3] -> max wait µs: the latest acceptable slot is now + max wait (0: now or never)
-- ARGV[4] -> margin µs, added to every window
-- ARGV[5], ARGV[6] -> limit, window µs of policy 0; ARGV[7], ARGV[8] -> policy 1; and so on
--
-- Returns {allowed, duplicate, delay_us, retry_after_us, remaining, policy, now_us, paused}
--   allowed         1: admitted and recorded at slot = now + delay_us. 0: denied, nothing recorded
--   duplicate       1: the id is already in the log; admitted again at its own slot, consuming nothing
--   delay_us        slot - now (>= 0) when allowed, else 0
--   retry_after_us  when denied (> 0): the same call made this much later is admitted if nobody else
--                   takes the room meanwhile; else 0
--   remaining       room left in the tightest policy's window at the slot (after this job), or at now
--                   when denied (counting reservations already handed out); never negative
--   policy          0-based index of the policy that blocks (the one needing the latest slot), or of the
--                   tightest policy when none blocks
--   now_us          Redis TIME in µs: the only clock that enters a decision
--   paused          1 when a provider pause is what sets the slot
--
-- Invariant: slots are handed out first come, first served (a new slot is never before the newest one), so
-- log order and cum order agree. For every policy (L per W) and every t, the cost of entries with slot in
-- (t-W-margin, t] is <= L. Entries older than the longest window are trimmed on every call.

local log, cum, pause = KEYS[1], KEYS[2], KEYS[3]
local id = ARGV[1]
local cost = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local margin = tonumber(ARGV[4])

-- Lua's tostring keeps 14 significant digits; µs timestamps have 16.
local function num(n)
  return string.format('%.0f', n)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local limits, windows, longest = {}, {}, 0
for i = 5, #ARGV, 2 do
  local n = #limits + 1
  limits[n] = tonumber(ARGV[i])
  windows[n] = tonumber(ARGV[i + 1]) + margin
  if cost > limits[n] then
    return redis.error_reply('ERR paygate: cost ' .. ARGV[2] .. ' exceeds limit ' .. ARGV[i])
  end
  if windows[n] > longest then longest = windows[n] end
end

-- Trim what no window can see any more; cum holds the same entries, in the same order, after "".
local trimmed = redis.call('ZREMRANGEBYSCORE', log, '-inf', num(now - longest))
if trimmed > 0 then
  local newest_gone = redis.call('ZRANGE', cum, trimmed, trimmed, 'WITHSCORES')
  redis.call('ZREMRANGEBYRANK', cum, 1, trimmed)
  if newest_gone[2] then redis.call('ZADD', cum, newest_gone[2], '') end
end

local top = redis.call('ZREVRANGE', cum, 0, 0, 'WITHSCORES')
local total = tonumber(top[2] or 0)

-- Cost of the entries newer than at - window of policy i: the window ending at `at`, plus any
-- reservations beyond it.
local function used(i, at)
  local older = redis.call('ZREVRANGEBYSCORE', log, num(at - windows[i]), '-inf', 'LIMIT', 0, 1)
  local base = redis.call('ZSCORE', cum, older[1] or '')
  return total - tonumber(base or 0)
end

local function tightest(at)
  local room, index = nil, 0
  for i = 1, #limits do
    local r = limits[i] - used(i, at)
    if room == nil or r < room then room, index = r, i - 1 end
  end
  if room < 0 then room = 0 end
  return room, index
end

local prev = redis.call('ZSCORE', log, id)
if prev then
  local slot = tonumber(prev)
  local at = math.max(slot, now)
  local room, index = tightest(at)
  return {1, 1, at - now, 0, room, index, now, 0}
end

-- The earliest slot: not before now, the pause, or the newest slot; and for every policy, late enough
-- that the entry whose departure makes room for `cost` has left the window.
local slot, paused = now, 0
local blocker, blocker_at = nil, now
local tail = redis.call('ZREVRANGE', log, 0, 0, 'WITHSCORES')
if tail[2] then slot = math.max(slot, tonumber(tail[2])) end
for i = 1, #limits do
  local threshold = total - limits[i] + cost
  if threshold > 0 then
    local must_leave = redis.call('ZRANGEBYSCORE', cum, num(threshold), '+inf', 'LIMIT', 0, 1)[1]
    if must_leave and must_leave ~= '' then
      local free_at = tonumber(redis.call('ZSCORE', log, must_leave)) + windows[i]
      if free_at > blocker_at then blocker, blocker_at = i - 1, free_at end
      if free_at > slot then slot = free_at end
    end
  end
end
local pause_until = tonumber(redis.call('GET', pause) or 0)
if pause_until > now and pause_until >= slot then slot, paused = pause_until, 1 end

local wait = slot - now
if wait > max_wait then
  local room, index = tightest(now)
  return {0, 0, 0, wait - max_wait, room, blocker or index, now, paused}
end

total = total + cost
if not top[1] then redis.call('ZADD', cum, 0, '') end
redis.call('ZADD', log, num(slot), id)
redis.call('ZADD', cum, num(total), id)
local ttl = math.ceil((wait + longest) / 1000) + 1000
redis.call('PEXPIRE', log, ttl)
redis.call('PEXPIRE', cum, ttl)
local room, index = tightest(slot)
return {1, 0, wait, 0, room, blocker or index, now, paused}
