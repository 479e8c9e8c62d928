-- limits.lua: a provider's live limits, the override `worker limits set` puts over the configured ones.
-- Every decision of family.lua checks the override's version (its KEYS[#KEYS-3], ARGV[15]) before anything
-- else, so that once `set` or `reset` returns, no decision is made under the limits it replaced.
--
-- KEYS[1] -> <prefix>:{<provider>}:limits  HASH  version: how many times the override was set or reset
--                                                (only grows; absent: 0, the configured limits); limits:
--                                                the override, "200/1s,5000/1m" (absent: the configured
--                                                limits); at: when it was last set or reset (µs, Redis
--                                                clock). Never expires: it is configuration
-- KEYS[2] -> <prefix>:{<provider>}:pace    STRING the pace's arrival time (family.lua): set and reset delete
--                                                it, since it was spaced for the old limits
--
-- ARGV[1] -> op: 'set', 'reset' or 'show'
-- ARGV[2] -> set: the limits, as gate.FormatPolicies writes them (checked by the caller); else ''
-- ARGV[3] -> the announcement channel, <prefix>:pauses
-- ARGV[4] -> the provider's name
--
-- Returns {version, limits ('' for the configured ones), at_us}, after the change for set and reset.
-- set and reset announce the change on ARGV[3] as "<provider> limits <at_us>": a worker holding a slot
-- decided before at_us, under the old limits, gives it up and asks again.

local op = ARGV[1]
if op == 'show' then
  local got = redis.call('HMGET', KEYS[1], 'version', 'limits', 'at')
  return {tonumber(got[1] or 0), got[2] or '', tonumber(got[3] or 0)}
end
if op ~= 'set' and op ~= 'reset' then return redis.error_reply('ERR paygate: op must be set, reset or show, got ' .. tostring(op)) end
if op == 'set' and ARGV[2] == '' then return redis.error_reply('ERR paygate: set needs limits') end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
redis.call('DEL', KEYS[2])
if op == 'set' then
  redis.call('HSET', KEYS[1], 'limits', ARGV[2], 'at', now)
else
  redis.call('HDEL', KEYS[1], 'limits')
  redis.call('HSET', KEYS[1], 'at', now)
end
redis.call('PUBLISH', ARGV[3], ARGV[4] .. ' limits ' .. now)
local limits = ''
if op == 'set' then limits = ARGV[2] end
return {version, limits, tonumber(now)}
