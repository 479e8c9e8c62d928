-- limits.lua: a provider's live limits, put over the configured ones by an operator (`worker limits set`)
-- or by the provider's own announcements (providers.<name>.limits_from_headers). Every decision of
-- lua/family checks their version (its KEYS[#KEYS-3], S[9]) before it reads or writes anything, so
-- that once `set` or `reset` returns, no decision is made under the limits it replaced.
--
-- KEYS[1] -> <prefix>:{<provider>}:limits  HASH  version: how many times the live limits changed (only
--                                                grows; absent: 0, the configured limits); limits: the
--                                                live limits, "200/1s,5000/1m" (absent: the configured
--                                                ones); source: who set them, 'override' or 'headers';
--                                                at: when they last changed (µs, Redis clock). Never
--                                                expires: it is configuration
-- KEYS[2] -> <prefix>:{<provider>}:pace    STRING the pace's arrival time (lua/family): a change deletes it,
--                                                since it was spaced for the old limits
--
-- ARGV[1] -> op: 'set', 'reset', 'show' or 'learn'
-- ARGV[2] -> set: the limits, as gate.FormatPolicies writes them (checked by the caller); learn: 'up' or
--            'down'; else ''
-- ARGV[3] -> the announcement channel, <prefix>:pauses
-- ARGV[4] -> the provider's name
-- ARGV[5] -> set and reset: who asks, 'override' (an operator: always done) or 'headers' (the provider's
--            announcements: never over an operator's override, and reset only what headers set); learn:
--            'learned'
-- learn (providers.<name>.adaptive) moves the learned limit, field learned (absent: ARGV[6]), within
-- ARGV[6]..ARGV[7] for the window ARGV[8] (as FormatDuration writes it), fleet-wide: 'down' (a 429) cuts
-- it to 95 % (85 % when the window before had a cut too), at most once per ARGV[9] µs (field cut_at),
-- whatever raised it meanwhile; 'up' (requests
-- succeeded while the limit bound) raises it, at most once per ARGV[9] µs after any change (at), by a
-- quarter until the first cut (field backed_off), then by 2 % (at least 1).
-- Never over an operator's or the headers' live limits. Only a cut is announced.
--
-- Returns {version, limits ('' for the configured ones), at_us, source ('' for the configured ones),
-- changed (1, or 0 when nothing changed)}, as in force after the call. A set of the limits and source in
-- force, or a change the source may not make, changes nothing. A change is announced on ARGV[3] as "<provider> limits <at_us>":
-- a worker holding a slot decided before at_us, under the old limits, gives it up and asks again.
-- The message is a gate.Announcement of kind AnnounceLimits (gate/announce.go writes and reads it).

local op, source = ARGV[1], ARGV[5]
local got = redis.call('HMGET', KEYS[1], 'version', 'limits', 'at', 'source')
local function current() return {tonumber(got[1] or 0), got[2] or '', tonumber(got[3] or 0), got[4] or '', 0} end
if op == 'show' then return current() end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = string.format('%d', now_us)
if op == 'learn' then
  local in_force = got[4] or ''
  if in_force == 'override' or in_force == 'headers' then return current() end
  -- One cut per window, whatever raised it meanwhile; a raise only a window after any change.
  local since = tonumber(got[3] or 0)
  if ARGV[2] == 'down' then since = tonumber(redis.call('HGET', KEYS[1], 'cut_at') or 0) end
  if now_us - since < tonumber(ARGV[9]) then return current() end
  local lo, hi = tonumber(ARGV[6]), tonumber(ARGV[7])
  local learned = lo -- in force: the configured limit (the range's min), or the learned one
  if in_force == 'learned' then learned = tonumber(redis.call('HGET', KEYS[1], 'learned') or lo) end
  local backed = redis.call('HGET', KEYS[1], 'backed_off') == '1'
  local next
  if ARGV[2] == 'down' then
    -- A cut in the window after a cut: still too many, cut deeper.
    local factor = 0.95
    if now_us - tonumber(redis.call('HGET', KEYS[1], 'cut_at') or 0) < 2 * tonumber(ARGV[9]) then factor = 0.85 end
    next = math.floor(learned * factor)
    redis.call('HSET', KEYS[1], 'backed_off', '1', 'cut_at', now)
  elseif backed then
    next = learned + math.max(1, math.floor(learned * 0.02))
  else
    next = math.ceil(learned * 1.25)
  end
  next = math.max(lo, math.min(hi, next))
  if next == learned then return current() end -- at min or max: nothing moves
  local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
  redis.call('DEL', KEYS[2])
  local limits = string.format('%d', next) .. '/' .. ARGV[8]
  redis.call('HSET', KEYS[1], 'limits', limits, 'at', now, 'source', 'learned', 'learned', string.format('%d', next))
  -- Slots handed out under a lower limit keep within a higher one: only a cut voids them.
  if next < learned then redis.call('PUBLISH', ARGV[3], ARGV[4] .. ' limits ' .. now) end
  return {version, limits, now_us, 'learned', 1}
end
if op ~= 'set' and op ~= 'reset' then return redis.error_reply('ERR paygate: op must be set, reset, show or learn, got ' .. tostring(op)) end
if source ~= 'override' and source ~= 'headers' then return redis.error_reply('ERR paygate: source must be override or headers, got ' .. tostring(source)) end
if op == 'set' and ARGV[2] == '' then return redis.error_reply('ERR paygate: set needs limits') end
local in_force = got[4] or ''
if source == 'headers' and in_force == 'override' then return current() end -- the operator's stand
if op == 'set' and got[2] == ARGV[2] and in_force == source then return current() end -- no change
if op == 'reset' and source == 'headers' and in_force ~= 'headers' then return current() end
if op == 'reset' and in_force == '' then return current() end -- the configured limits are in force

local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('DEL', KEYS[2])
local limits = ''
if op == 'set' then
  limits = ARGV[2]
  redis.call('HSET', KEYS[1], 'limits', limits, 'at', now, 'source', source)
else
  redis.call('HDEL', KEYS[1], 'limits', 'source', 'learned', 'backed_off', 'cut_at')
  redis.call('HSET', KEYS[1], 'at', now)
  source = ''
end
redis.call('PUBLISH', ARGV[3], ARGV[4] .. ' limits ' .. now)
return {version, limits, tonumber(now), source, 1}
