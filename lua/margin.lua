-- margin.lua: the margin in force for one provider, which follows the fleet's lateness between the
-- configured margin (the floor) and a ceiling. Workers report the lateness they measure; a request the
-- provider throttled though the gate had admitted it on time is reported too.
--
-- KEYS[1] -> <prefix>:{<provider>}:margin    STRING the margin in force, µs (absent: the floor)
-- KEYS[2] -> <prefix>:{<provider>}:lateness  HASH   reporter -> "<p99 µs> <at µs>", one per worker, and
--                                                   '_changed' -> µs of the last change, '_why' -> why
--
-- ARGV[1] -> op: 'lateness' (a worker's p99 lateness), 'throttled' (a 429 on a slot the gate gave) or
--            'read' (changes nothing)
-- ARGV[2] -> reporter: a worker's id (not starting with '_'); '' for read
-- ARGV[3] -> lateness: the reporter's p99 µs ('lateness'), else 0
-- ARGV[4] -> floor µs, ARGV[5] -> ceiling µs (>= floor)
-- ARGV[6] -> hold µs: a margin widened or kept up is narrowed only after this long
-- ARGV[7] -> fresh µs: a report older than this no longer counts
--
-- The target is 4 x the highest p99 among fresh reports, within [floor, ceiling]: the worker gives a slot
-- back when it wakes more than half the margin late, so the p99 wake-up then stays within half of that,
-- and the other half of the margin is left for the trip to the provider. A target above the margin in
-- force takes over at once; below it, the margin narrows a quarter of the way down at most once a second,
-- and only once hold has passed since it last widened. A throttle doubles the margin in force (at least by the floor, and by 5ms), up to the ceiling:
-- the provider counted more in a window than the gate admitted, so the margin was too thin for this
-- fleet's trip to it.
--
-- Returns {margin µs, changed µs (0: never), why}. The keys expire after a day without a report.

local op, reporter = ARGV[1], ARGV[2]
local late, floor, ceiling = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local hold, fresh = tonumber(ARGV[6]), tonumber(ARGV[7])
if op ~= 'lateness' and op ~= 'throttled' and op ~= 'read' then
  return redis.error_reply('ERR paygate: op must be lateness, throttled or read, got ' .. tostring(op))
end
if not (late and floor and ceiling and hold and fresh) or late < 0 or floor < 0 or ceiling < floor then
  return redis.error_reply('ERR paygate: want lateness >= 0 and 0 <= floor <= ceiling')
end
if op ~= 'read' and (#reporter < 1 or #reporter > 200 or string.sub(reporter, 1, 1) == '_') then
  return redis.error_reply('ERR paygate: reporter must be 1..200 bytes, not starting with _')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function int(x) return string.format('%d', x) end
local cur = tonumber(redis.call('GET', KEYS[1]) or floor)
cur = math.min(math.max(cur, floor), ceiling)
local state = redis.call('HMGET', KEYS[2], '_changed', '_why')
local changed, why = tonumber(state[1] or 0), state[2] or 'floor'
if op == 'read' then return {int(cur), int(changed), why} end

local to, reason = cur, why
if op == 'throttled' then
  to = math.min(ceiling, math.max(2 * cur, cur + math.max(floor, 5000)))
  reason = 'throttled: the provider counted more than the gate admitted'
else
  redis.call('HSET', KEYS[2], reporter, int(late) .. ' ' .. int(now))
  local high, all = 0, redis.call('HGETALL', KEYS[2])
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 1) ~= '_' then
      local p, at = string.match(all[i + 1], '^(%d+) (%d+)$')
      if not p or now - tonumber(at) > fresh then
        redis.call('HDEL', KEYS[2], all[i])
      else
        high = math.max(high, tonumber(p))
      end
    end
  end
  local target = math.min(math.max(4 * high, floor), ceiling)
  if target > cur then
    to = target
    reason = 'lateness: the fleet p99 is ' .. int(high) .. 'us'
  elseif target < cur and now - changed >= hold then
    to = math.max(target, cur - math.max(1000, math.ceil((cur - target) / 4)))
    if to <= floor then reason = 'floor' else reason = 'narrowing: the fleet p99 is ' .. int(high) .. 'us' end
  end
end
if to > cur or op == 'throttled' then changed = now end
if to < cur then changed = now - hold + 1000000 end -- the next step down a second from now
redis.call('HSET', KEYS[2], '_changed', int(changed), '_why', reason)
redis.call('SET', KEYS[1], int(to), 'PX', 86400000)
redis.call('PEXPIRE', KEYS[2], 86400000)
return {int(to), int(changed), reason}
