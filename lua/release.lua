-- release.lua: give back a job's admission (a worker that woke too late to use its slot, or whose request
-- the provider refused). Removing entries never breaks the invariant; the units are free for later
-- decisions. Only the admission the caller holds is removed: if the id's entry is at another slot, a
-- redelivery has since been admitted (moved) under it, and that entry belongs to someone else.
--
-- KEYS[1] -> <prefix>:{<provider>}:log    ZSET   one member per unit of cost (id, id.."\0"..k for k >= 2)
--
-- ARGV[1] -> job id
-- ARGV[2] -> cost: the job's units to remove
-- ARGV[3] -> the slot (µs) the caller was admitted at; 0: whatever the slot
--
-- Returns the number of members removed (0 when the job was not in the log, or is at another slot).

local slot = tonumber(ARGV[3])
if slot ~= 0 then
  local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
  if not at or tonumber(at) ~= slot then return 0 end
end
local members = {ARGV[1]}
for k = 2, tonumber(ARGV[2]) do
  members[#members + 1] = ARGV[1] .. '\0' .. k
end
return redis.call('ZREM', KEYS[1], unpack(members))
