-- release.lua: give back a job's admission (a worker that woke too late to use its slot). Removing entries
-- never breaks the invariant; the units are free for later decisions.
--
-- KEYS[1] -> <prefix>:{<provider>}:log    ZSET   one member per unit of cost (id, id.."\0"..k for k >= 2)
--
-- ARGV[1] -> job id
-- ARGV[2] -> cost: the job's units to remove
--
-- Returns the number of members removed (0 when the job was not in the log).

local members = {ARGV[1]}
for k = 2, tonumber(ARGV[2]) do
  members[#members + 1] = ARGV[1] .. '\0' .. k
end
return redis.call('ZREM', KEYS[1], unpack(members))
