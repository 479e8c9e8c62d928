-- events.lua: count a provider's notable outcomes per minute, for the operator's view (worker dashboard):
-- every worker adds to the same counters, which the dashboard reads.
--
-- KEYS[1..n] -> <prefix>:{<provider>}:events:<minute>  HASH  event -> count, for the minute (Unix time / 60,
--                                                      the worker's clock) in the name; kept an hour
--
-- ARGV[1] -> 'count' or 'read'
-- count: ARGV[2] -> the event ("throttled": a 429; "dead:<reason>": a dead letter), ARGV[3] -> how long the
--        key is kept (ms). KEYS[1] is the minute's key. Returns the minute's new count.
-- read:  returns, for each key in order, its HGETALL (a flat event, count list; empty for a minute
--        without events or past its hour).

if ARGV[1] == 'count' then
  local n = redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return n
end
if ARGV[1] ~= 'read' then return redis.error_reply('ERR paygate: op must be count or read, got ' .. tostring(ARGV[1])) end
local out = {}
for i, k in ipairs(KEYS) do out[i] = redis.call('HGETALL', k) end
return out
