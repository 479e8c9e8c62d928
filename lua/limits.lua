-- limits.lua: a provider's live limits, put over the configured ones by an operator (`worker limits set`)
-- or by the provider's own announcements (providers.<name>.limits_from_headers). Every decision of
-- family.lua checks their version (its KEYS[#KEYS-3], ARGV[15]) before it reads or writes anything, so
-- that once `set` or `reset` returns, no decision is made under the limits it replaced.
--
-- KEYS[1] -> <prefix>:{<provider>}:limits  HASH  version: how many times the live limits changed (only
--                                                grows; absent: 0, the configured limits); limits: the
--                                                live limits, "200/1s,5000/1m" (absent: the configured
--                                                ones); source: who set them, 'override' or 'headers';
--                                                at: when they last changed (µs, Redis clock). Never
--                                                expires: it is configuration
-- KEYS[2] -> <prefix>:{<provider>}:pace    STRING the pace's arrival time (family.lua): a change deletes it,
--                                                since it was spaced for the old limits
--
-- ARGV[1] -> op: 'set', 'reset' or 'show'
-- ARGV[2] -> set: the limits, as gate.FormatPolicies writes them (checked by the caller); else ''
-- ARGV[3] -> the announcement channel, <prefix>:pauses
-- ARGV[4] -> the provider's name
-- ARGV[5] -> set and reset: who asks, 'override' (an operator: always done) or 'headers' (the provider's
--            announcements: never over an operator's override, and reset only what headers set)
--
-- Returns {version, limits ('' for the configured ones), at_us, source ('' for the configured ones),
-- changed (1, or 0 when nothing changed)}, as in force after the call. A set of the limits and source in
-- force, or a change the source may not make, changes nothing. A change is announced on ARGV[3] as "<provider> limits <at_us>":
-- a worker holding a slot decided before at_us, under the old limits, gives it up and asks again.

local op, source = ARGV[1], ARGV[5]
local got = redis.call('HMGET', KEYS[1], 'version', 'limits', 'at', 'source')
local function current() return {tonumber(got[1] or 0), got[2] or '', tonumber(got[3] or 0), got[4] or '', 0} end
if op == 'show' then return current() end
if op ~= 'set' and op ~= 'reset' then return redis.error_reply('ERR paygate: op must be set, reset or show, got ' .. tostring(op)) end
if source ~= 'override' and source ~= 'headers' then return redis.error_reply('ERR paygate: source must be override or headers, got ' .. tostring(source)) end
if op == 'set' and ARGV[2] == '' then return redis.error_reply('ERR paygate: set needs limits') end
local in_force = got[4] or ''
if source == 'headers' and in_force == 'override' then return current() end -- the operator's stand
if op == 'set' and got[2] == ARGV[2] and in_force == source then return current() end -- no change
if op == 'reset' and source == 'headers' and in_force ~= 'headers' then return current() end

local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('DEL', KEYS[2])
local limits = ''
if op == 'set' then
  limits = ARGV[2]
  redis.call('HSET', KEYS[1], 'limits', limits, 'at', now, 'source', source)
else
  redis.call('HDEL', KEYS[1], 'limits', 'source')
  redis.call('HSET', KEYS[1], 'at', now)
  source = ''
end
redis.call('PUBLISH', ARGV[3], ARGV[4] .. ' limits ' .. now)
return {version, limits, tonumber(now), source, 1}
