-- family/state.lua: the per-call state. These file-level locals are set as each call begins (begin,
-- begin_job, start; then algo.init) and read and written by everything after them: the operations, the
-- record, the algorithm (see contract.lua: "How it runs", for why they are locals and how many a function
-- may use).

-- The call's keys (see contract.lua's KEYS): the id record, the pause, the marks, the registry of
-- merchants, the live limits, the in-flight leases, the pace, the epoch.
local KEYS, ARGV
local ids, pause, marks, merchants, live, flight, pace_key, epoch
-- The job's: op (ARGV[1]; 'reserve' for each of a batch's jobs), its id (ARGV[2]) and merchant (ARGV[7]),
-- cost (ARGV[3]) and forced (ARGV[6] = 1). arg4 is ARGV[4] as a number, whose meaning is the op's:
-- reserve's max wait (µs), the slot (µs) release, depart and postpone name, how many merchants to list.
-- stale is ARGV[5] (reserve's stale µs, depart's late µs).
local op, id, merchant
local cost, arg4, stale, forced
-- The settings (ARGV[8], see contract.lua's S): conf is their parsed table (parse_settings; the algorithm
-- keeps there what it derives from them alone), the others its fields. limits[i], windows[i] are policy i's
-- (1-based), P of them: the provider's are 1..PP (PP = P - M), the merchant's the last M (PP+1..P).
local margin, dedup, buckets, warmup, pace, tolerance, max_flight, lease, M
local conf, limits, windows, P, PP
-- upto: the policies algo.earliest looks at (1..upto): the provider's first, then all (see reserve)
local upto
-- provider_counted, merchant_counted: the job being released or moved was counted by the provider's, the
-- merchant's counters in this call's keys (its marker is in the id record; see counted_marker): only then
-- do its units go back there.
local provider_counted, merchant_counted
-- now: the Redis clock (µs) as the call began; seen_for: how long the registry of merchants keeps a
-- merchant after its newest slot (µs).
local now, seen_for
local newest_read, newest_value -- newest_slot's cache
local kept, standing -- reserve's: writes a denial keeps; in-flight leases standing
local reset_memo -- reset_after's
-- C (the call): what a call's jobs share beyond the locals above, in one table because a function has room
-- for no more upvalues (start sets its fields):
--   got[job]      the slot in the record of the batch's job-th id as the call began (ZMSCORE's reply,
--                 false: not there; a batch's ids are distinct and read at once); nil for a single call,
--                 whose lookup reads its own; job: the batch's job being decided
--   ttl[key]      the expiry finish keeps key at least (ms); see extend
--   rec[1..nrec]  the record's new members (score, member, ...); slot, score: the slot record formatted
--                 last and its string (a batch's jobs mostly share one)
--   admitted      a job was admitted; last: the latest slot admitted
--   pause_until   the pause (µs); tat: the pace's arrival time (µs)
--   first_lease   the earliest lapse of a lease taken; renew_flight: the call's removal of lapsed leases
--                 may empty the in-flight set (its expiry then goes with it, and finish sets it anew)
--   p, m          counted_marker's hashes of this call's keys
--   cost_arg, arg4_arg, force_arg, merchant_arg  begin_job's: the last good job arguments, as given, and
--   args_op, args_conf   the op and the settings they were checked under (kept from call to call: see
--                 begin_job)
--   out, nout     a batch's reply and how many values it holds (gate's TestBatchJobWithoutReplyWritesNothing
--                 rewrites a line naming C.nout)
-- begin forgets the reply (a batch sets it before start). The table lives on
-- between a function's calls: start sets every other field, and makes ttl anew only when the call
-- before used it.
local C = {ttl = {}, rec = {}, nrec = 0}

local function bad(what, value) return redis.error_reply('ERR paygate: ' .. what .. ', got ' .. tostring(value)) end
local function whole(v) return v and v >= 0 and v % 1 == 0 end

-- settings are the settings strings (ARGV[8]) a function has parsed, by string: kept between its calls,
-- up to 64 (then it starts afresh). A call never changes their tables; the algorithms keep there, once,
-- what follows from the settings alone (conf.sl_W, conf.sw_g, conf.tb, conf.arrivals, names.vfields).
local settings, nsettings = {}, 0

-- parse_settings parses a settings string (see the header): its table, or nil and what is wrong.
local function parse_settings(str)
  local x = {}
  for w in string.gmatch(str, '%S+') do
    local v = tonumber(w)
    if not v or v < 0 or v % 1 ~= 0 then return nil, 'settings must be whole numbers >= 0, got ' .. w end
    x[#x + 1] = v
  end
  if #x < 13 or #x % 2 ~= 1 then return nil, 'settings must be 11 numbers then limit, window pairs, got ' .. #x end
  local c = {margin = x[1], dedup = x[2], buckets = x[3], warmup = x[4], pace = x[5], tolerance = x[6],
    max_flight = x[7], lease = x[8], version = string.format('%d', x[9]), shape = string.format('%d', x[10]),
    M = x[11], limits = {}, windows = {}, P = 0}
  for i = 12, #x, 2 do
    if x[i] < 1 or x[i + 1] < 1 then return nil, 'limits and windows must be >= 1, got ' .. x[i] .. '/' .. x[i + 1] end
    c.P = c.P + 1
    c.limits[c.P], c.windows[c.P] = x[i], x[i + 1]
  end
  if c.M >= c.P then return nil, 'merchant policies must be fewer than all, got ' .. c.M end
  return c
end

-- begin sets the call's state from its keys, op, stale (ARGV[5]) and settings (ARGV[8]), checking each;
-- begin_job sets one job's (ARGV[2], [3], [4], [6], [7]); start then reads what every op needs. Every
-- check comes before anything is read or written: a bad call is an error reply and changes nothing.
local function begin(keys, argv, o, stale_arg, settings_arg, nargs_ok)
  KEYS, ARGV = keys, argv
  local nk = #KEYS
  ids, pause, marks = KEYS[1], KEYS[2], KEYS[3]
  merchants, live, flight, pace_key, epoch = KEYS[nk - 4], KEYS[nk - 3], KEYS[nk - 2], KEYS[nk - 1], KEYS[nk]
  op = o
  if op ~= 'reserve' and op ~= 'release' and op ~= 'depart' and op ~= 'postpone' and op ~= 'status' and op ~= 'merchants' then
    return bad('op must be reserve, release, depart, postpone, status or merchants', op)
  end
  if not nargs_ok then return bad('want 8 arguments', #argv) end
  stale = tonumber(stale_arg)
  if not whole(stale) then return bad('ARGV[5] must be a whole number >= 0', stale_arg) end
  local c = settings[settings_arg]
  if not c then
    local err
    c, err = parse_settings(settings_arg)
    if not c then return bad('ARGV[8]: ' .. err, settings_arg) end
    if nsettings >= 64 then settings, nsettings = {}, 0 end
    settings[settings_arg], nsettings = c, nsettings + 1
  end
  conf, C.out = c, nil
  margin, dedup, buckets, warmup, pace, tolerance = c.margin, c.dedup, c.buckets, c.warmup, c.pace, c.tolerance
  max_flight, lease, M, limits, windows, P = c.max_flight, c.lease, c.M, c.limits, c.windows, c.P
  PP = P - M
  return nil
end

-- job_args sets cost, arg4, forced and merchant from a job's arguments, checking each.
local function job_args(cost_arg, arg4_arg, force_arg, merchant_arg)
  cost, arg4, forced = tonumber(cost_arg), tonumber(arg4_arg), tonumber(force_arg)
  if not whole(cost) then return bad('ARGV[3] must be a whole number >= 0', cost_arg) end
  if not whole(arg4) then return bad('ARGV[4] must be a whole number >= 0', arg4_arg) end
  if not whole(forced) then return bad('ARGV[6] must be a whole number >= 0', force_arg) end
  forced = forced == 1
  merchant = merchant_arg
  if #merchant > 600 then return bad('merchant must be at most 600 bytes; length', #merchant) end
  if op == 'reserve' then
    for i = 1, P do
      if cost < 1 or cost > limits[i] then
        return redis.error_reply(string.format('ERR paygate: cost %d must be 1..%d (limit %d per %dµs)', cost, limits[i], limits[i], windows[i]))
      end
    end
  end
  if M > 0 and merchant == '' then return bad('merchant policies need a merchant', M) end
  return nil
end

local function begin_job(job_id, cost_arg, arg4_arg, force_arg, merchant_arg)
  id = job_id
  if op ~= 'status' and op ~= 'merchants' and (#id < 1 or #id > 600 or string.find(id, '\0', 1, true)) then
    return bad('job id must be 1..600 bytes without NUL; length', #id)
  end
  -- A batch's jobs, and a worker's calls, mostly share these four: parsed and checked again only when they
  -- or the op and settings they were checked under change (C.cost_arg .. C.args_conf: the last good ones,
  -- kept from call to call as the settings are; cost, arg4, forced and merchant still hold what they gave).
  if cost_arg ~= C.cost_arg or arg4_arg ~= C.arg4_arg or force_arg ~= C.force_arg or merchant_arg ~= C.merchant_arg
    or op ~= C.args_op or conf ~= C.args_conf then
    C.cost_arg = nil
    local err = job_args(cost_arg, arg4_arg, force_arg, merchant_arg)
    if err then return err end
    C.cost_arg, C.arg4_arg, C.force_arg, C.merchant_arg = cost_arg, arg4_arg, force_arg, merchant_arg
    C.args_op, C.args_conf = op, conf
  end
  upto, provider_counted, merchant_counted, reset_memo = PP, false, false, nil
  return nil
end

-- start reads what every op needs (the live limits' version, the clock) and sets the rest of the call's
-- state.
local function start()
  -- The live limits: decided under limits that are no longer in force, the call is refused (see S[9]).
  local version = redis.call('HGET', live, 'version') or '0'
  if version ~= conf.version then return redis.error_reply('PAYGATE_LIMITS ' .. version) end

  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  start_writes()
  seen_for = math.max(dedup, 60000000)
  newest_read, newest_value, kept, standing, reset_memo = false, nil, 0, 0, nil
  C.got, C.cancels, C.job = nil, nil, 0
  if next(C.ttl) ~= nil then C.ttl = {} end
  if C.nrec > 4096 then C.rec = {} end -- a big batch's: not kept for ever
  C.nrec, C.admitted, C.last, C.pause_until, C.tat, C.first_lease, C.renew_flight = 0, false, 0, 0, 0, nil, false
  C.p, C.m = nil, nil
  C.slot, C.score = nil, nil
  return nil
end

-- What the operations and the algorithms' files share.

-- reset_after is algo.reset_after(), computed once until the state changes: the family sets reset_memo to
-- nil after every algo.commit, force, give_back and take_back. Saving, recording and replying each need it.
local function reset_after()
  if not reset_memo then reset_memo = algo.reset_after() end
  return reset_memo
end

-- tightest returns the smallest room_of(i, at) over the policies and its policy (1-based): algo.room's shape.
local function tightest(room_of, at)
  local room, index = nil, 1
  for i = 1, P do
    local r = room_of(i, at)
    if room == nil or r < room then room, index = r, i end
  end
  return room, index
end

local EPS = 1e-9 -- fractions of a unit this small are rounding, not room
