-- breaker.lua: a provider's circuit breaker, one for the whole fleet. Workers report their requests'
-- transient failures (5xx, timeouts, refused or reset connections), and, while a run of them is known to be
-- in progress, the answers that end it; after `failures` in a row the provider opens: its pause (the key
-- every decision of lua/family honours) holds it, and after `open_for` exactly one job may take the probe,
-- whose request alone goes through the hold (lua/family reads its mark). The probe's answer closes the
-- breaker; its failure reopens it for twice as long, up to `open_max`.
--
-- KEYS[1] -> <prefix>:{<provider>}:breaker  HASH   the breaker (absent: closed, no failures):
--              phase      'closed' | 'open' | 'probing'
--              failures   transient failures in a row (closed)
--              open_for   the open interval in force, µs (open, probing); the first one's is ARGV[7]
--              until      open: when the probe is due (µs); probing: when the probe's token lapses
--              hold       the pause the breaker set (µs): until + ARGV[10]; 0 when closed
--              probe      probing: the job id holding the probe
--              since      when the phase last changed (µs)
--              seq        the state's version: moves forward (µs, at least +1) at every announced change
--              opened     how many times it opened (reopenings included)
--              throttled  the latest end of a pause another writer (pause.lua: a 429) asked for while the
--                         hold covered it (µs): what closing the breaker leaves in force
--            Kept a day past its hold (a day after a close or a reset), so a fleet restarted mid-outage
--            finds it.
-- KEYS[2] -> <prefix>:{<provider>}:pause    STRING the provider's pause (pause.lua, lua/family): set to at
--                                                  least the hold while open or probing (never shortened
--                                                  below another writer's pause); lifted on close, to
--                                                  what another writer asked for
-- KEYS[3] -> <prefix>:{<provider>}:marks    ZSET   lua/family's marks: member id.."\0p" is the probe's,
--                                                  score = the hold it was granted under; a reserve of
--                                                  that id is not held by a pause up to that score
--
-- ARGV[1] -> op: 'state' (reads), 'fail' (a transient failure), 'answer' (an answer that is no transient
--            failure: a success, a decline, a 4xx, a 429), 'probe' (take the probe)
-- ARGV[2] -> the provider's name, ARGV[3] -> the announcement channel (<prefix>:pauses)
-- ARGV[4] -> the job id (fail, answer, probe: as admitted, gate id; '' for state)
-- ARGV[5] -> fail: when the failed request's admission was decided to go (its slot, µs, Redis clock; 0:
--            unknown). A failure of a request sent before the breaker last closed says nothing of the
--            provider now, and is not counted. The other ops: 0
-- ARGV[6] -> failures: how many in a row open it (>= 1)
-- ARGV[7] -> open_for µs (> 0), ARGV[8] -> open_max µs (>= open_for)
-- ARGV[9] -> probe µs: how long the probe's holder has to report before another job may take it (its max
--            wait, the provider's timeout and a slack)
-- ARGV[10] -> reach µs: how far the hold reaches past `until`: the fleet's max wait, so that a reserve
--            while open is denied until the probe is due rather than reserved at the hold's end
--
-- Rules. fail, closed: counted (failures + 1) unless sent before `since`; at `failures` it opens for
-- open_for. fail, probing, by the probe's holder: reopens for min(2 x open_for, open_max). Every other
-- failure (open: requests in flight when it opened; probing: not the probe) is not counted. answer,
-- closed: resets the count. answer, probing, by the probe's holder: closes, and lifts the hold. Every other
-- answer changes nothing. probe, open or probing, once `until` has passed: granted to this job (the token
-- lapses after ARGV[9]; the hold moves to the lapse + reach), unless another writer's pause reaches past
-- the hold (then `until` in the reply is that pause's end: wait for it); granted again to the job that
-- holds it.
--
-- Returns {phase (0 closed, 1 open, 2 probing), failures, open_for µs, until µs, hold µs, now µs, seq,
-- changed (1: this call changed the phase), flag (probe: 1 granted; fail: 1 counted), opened, since µs,
-- probe id}. A change of phase, and a run of failures beginning or ending, is published on ARGV[3] as
-- "<provider> breaker <phase> <seq> <failures> <until_us> <hold_us> <now_us>" (phase by name; times 0
-- when none): a gate.Announcement of kind AnnounceBreaker (gate/announce.go writes and reads it).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local op, name, channel, job = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local sent, threshold, base, cap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local probe_us, reach = tonumber(ARGV[9]), tonumber(ARGV[10])
if op ~= 'state' and op ~= 'fail' and op ~= 'answer' and op ~= 'probe' then
  return redis.error_reply('ERR paygate: breaker op must be state, fail, answer or probe, got ' .. tostring(op))
end
if not (sent and sent >= 0 and threshold and threshold >= 1 and base and base > 0 and cap and cap >= base and
    probe_us and probe_us > 0 and reach and reach >= 0) then
  return redis.error_reply('ERR paygate: breaker wants sent >= 0, failures >= 1, 0 < open_for <= open_max, probe > 0, reach >= 0')
end

local h = redis.call('HMGET', KEYS[1], 'phase', 'failures', 'open_for', 'until', 'hold', 'probe', 'since', 'seq',
  'opened', 'throttled')
local B = {phase = h[1] or 'closed', failures = tonumber(h[2] or 0), open_for = tonumber(h[3] or base),
  ['until'] = tonumber(h[4] or 0), hold = tonumber(h[5] or 0), probe = h[6] or '', since = tonumber(h[7] or 0),
  seq = tonumber(h[8] or 0), opened = tonumber(h[9] or 0), throttled = tonumber(h[10] or 0)}
local dirty, announce, changed, flag = false, false, 0, 0
local wait_until = 0 -- a probe refused for another writer's pause: its end, the reply's until

local function int(v) return string.format('%d', v) end

-- others is the pause another writer asked for beside the hold: one reaching past the hold in the key,
-- or a shorter one the hold covered (throttled); 0 when none is still ahead.
local function others(cur)
  local other = B.throttled
  if cur > B.hold and cur > other then other = cur end
  if other <= now then other = 0 end
  return other
end

local function set_pause(until_us)
  redis.call('SET', KEYS[2], int(until_us), 'PX', int(math.ceil((until_us - now) / 1000) + 1000))
end

-- hold_until holds the provider until hold_us (its pause, at least that; never shorter than another
-- writer's).
local function hold_until(hold_us)
  local other = others(tonumber(redis.call('GET', KEYS[2]) or 0))
  B.hold, B.throttled = hold_us, other
  set_pause(math.max(hold_us, other))
end

-- lift ends the hold: the pause goes back to what another writer asked for, or goes.
local function lift()
  local cur = tonumber(redis.call('GET', KEYS[2]) or 0)
  local other = others(cur)
  if cur > 0 and cur <= B.hold then
    if other > 0 then set_pause(other) else redis.call('DEL', KEYS[2]) end
  end
  B.hold, B.throttled = 0, 0
end

local function drop_probe()
  if B.probe ~= '' then redis.call('ZREM', KEYS[3], B.probe .. '\0p') end
  B.probe = ''
end

-- to_phase moves the breaker to phase p, now.
local function to_phase(p)
  B.phase, B.since, dirty, announce, changed = p, now, true, true, 1
end

local function open(interval)
  drop_probe()
  to_phase('open')
  B.open_for, B['until'], B.failures, B.opened = interval, now + interval, 0, B.opened + 1
  hold_until(B['until'] + reach)
end

local function close()
  drop_probe()
  lift()
  to_phase('closed')
  B.open_for, B['until'], B.failures = base, 0, 0
end

-- grant gives job the probe: the token lapses after probe_us, and the hold reaches past it; the job's mark
-- lets its reserve through the hold (not through another writer's longer pause).
local function grant()
  drop_probe()
  to_phase('probing')
  B.probe, B['until'] = job, now + probe_us
  hold_until(B['until'] + reach)
  redis.call('ZADD', KEYS[3], int(B.hold), job .. '\0p')
  local ttl = math.ceil((B.hold - now) / 1000) + 1000
  if redis.call('PTTL', KEYS[3]) < ttl then redis.call('PEXPIRE', KEYS[3], int(ttl)) end
  flag = 1
end

if op == 'fail' then
  if B.phase == 'closed' and not (sent > 0 and sent < B.since) then
    B.failures, dirty, flag = B.failures + 1, true, 1
    if B.failures >= threshold then
      open(base)
    elseif B.failures == 1 then
      announce = true -- a run began: workers report their answers until it ends
    end
  elseif B.phase == 'probing' and job == B.probe then
    flag = 1
    open(math.min(2 * B.open_for, cap))
  end
elseif op == 'answer' then
  if B.phase == 'closed' and B.failures > 0 then
    B.failures, dirty, announce = 0, true, true
  elseif B.phase == 'probing' and job == B.probe then
    close()
  end
elseif op == 'probe' then
  if B.phase == 'probing' and job == B.probe and now < B['until'] then
    flag = 1
  elseif B.phase ~= 'closed' and now >= B['until'] then
    local cur = tonumber(redis.call('GET', KEYS[2]) or 0)
    if cur > B.hold and cur > now then
      wait_until = cur -- another writer's pause reaches past the hold: the probe waits for it too
    else
      grant()
    end
  end
end
if B.phase ~= 'closed' then wait_until = math.max(wait_until, B['until']) else wait_until = 0 end

if announce then B.seq = math.max(now, B.seq + 1) end
if dirty then
  redis.call('HSET', KEYS[1], 'phase', B.phase, 'failures', int(B.failures), 'open_for', int(B.open_for),
    'until', int(B['until']), 'hold', int(B.hold), 'probe', B.probe, 'since', int(B.since), 'seq', int(B.seq),
    'opened', int(B.opened), 'throttled', int(B.throttled))
  redis.call('PEXPIRE', KEYS[1], int(math.ceil(math.max(B.hold - now, 0) / 1000) + 86400000))
end
local phases = {closed = 0, open = 1, probing = 2}
if announce then
  local shown = B['until']
  if B.phase == 'closed' then shown = 0 end
  -- "<provider> breaker <phase> <seq> <failures> <until_us> <hold_us> <now_us>": a gate.Announcement of
  -- kind AnnounceBreaker (gate/announce.go).
  redis.call('PUBLISH', channel, name .. ' breaker ' .. B.phase .. ' ' .. int(B.seq) .. ' ' .. int(B.failures) .. ' ' ..
    int(shown) .. ' ' .. int(B.hold) .. ' ' .. int(now))
end
return {phases[B.phase] or 0, B.failures, B.open_for, wait_until, B.hold, now, B.seq, changed, flag, B.opened, B.since, B.probe}
