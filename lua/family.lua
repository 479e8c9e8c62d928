-- family.lua: paygate's gate, the one driver every algorithm runs under, as one script with the algorithm's
-- own file appended (sliding_log.lua, sliding_window.lua, token_bucket.lua, gcra.lua, fixed_window.lua,
-- leaky_bucket.lua): input checks, the id record (duplicates, moves, release), the pause, the pace, the
-- warm-up, the Redis clock, and the operations. The algorithm's file fills the table `algo` (see "The
-- algorithm's part" below); gate.go appends the line that runs paygate() (see the end).
--
-- KEYS[1] -> <prefix>:{<provider>}:ids    ZSET   the id record, score = slot (µs, Redis clock); kept until
--                                                slot + dedup. One member per unit of cost when the
--                                                algorithm counts members (sliding_log, whose log it is:
--                                                key ...:log): the job id, then id.."\0"..k for its k-th unit;
--                                                otherwise the job id, and id.."\0"..n when its cost n > 1;
--                                                under the counters (algo.counters), markers naming the
--                                                keys that counted the job (see counted_marker)
-- KEYS[2] -> <prefix>:{<provider>}:pause  STRING slot time (µs) before which nothing is admitted
-- KEYS[3] -> <prefix>:{<provider>}:marks  ZSET   the id record's marks: member id.."\0s": its request was
--                                                accepted though not settled (sent.lua); id.."\0d": a
--                                                duplicate of it was let go on its slot. Score = until when
--                                                the mark matters (µs, Redis clock: as long as the record
--                                                keeps the id); every write of a mark trims the marks past
--                                                theirs, and the key expires after the latest
-- KEYS[4..#KEYS-5] -> the algorithm's state, all with the provider's hash tag (see its file): the
--                                                provider's, then the merchant's (ARGV[7]) when it has
--                                                limits of its own (S[11] > 0; only for algorithms
--                                                that set algo.merchants)
-- KEYS[#KEYS-4] -> <prefix>:{<provider>}:merchants ZSET the merchants seen: member = merchant (ARGV[7]),
--                                                score = its newest admission's slot (µs); kept until that
--                                                slot plus a minute (or dedup, if longer)
-- KEYS[#KEYS-3] -> <prefix>:{<provider>}:limits HASH the live limits (limits.lua): only its version is read
-- KEYS[#KEYS-2] -> <prefix>:{<provider>}:flight ZSET the in-flight leases (S[7]): member =
--                                                id.."\0"..now_us of the admission that took it
--                                                (id.."\0d"..now_us for a duplicate let go), score = when
--                                                the lease lapses (µs): its slot plus S[8]. land.lua
--                                                ends one
-- KEYS[#KEYS-1] -> <prefix>:{<provider>}:pace  STRING the pace's theoretical arrival time (µs)
-- KEYS[#KEYS] -> <prefix>:{<provider>}:epoch  STRING "<began> <history> @<shape>": when this provider's
--                                                state began (µs), the replication history it was written
--                                                under (see current_history; '' where unknown) and the
--                                                shape of the state (S[10]); one per provider, never
--                                                expires. Its name also gives the warm-up's announcement
--                                                channel, <prefix>:pauses, and the provider's name
--
-- ARGV[1] -> op: 'reserve', 'release', 'depart', 'postpone', 'status' or 'merchants' (the last two change
--            nothing), or 'batch' (below)
-- ARGV[2] -> job id: 1..600 bytes, no NUL ('' for status)
-- ARGV[3] -> cost: integer >= 1 and <= every limit (reserve; the other ops ignore it)
-- ARGV[4] -> reserve: max wait µs (the latest acceptable slot is now + max wait); release: the slot (µs) the
--            caller was admitted at, 0 for wherever the id is; depart, postpone: the slot (µs) it was
--            admitted at
-- ARGV[5] -> reserve: stale µs: a duplicate whose slot is more than this before now is moved; 0: never.
--            depart: late µs: the request left at most this long after its slot (the caller's estimate,
--            never early); the other ops: 0
-- ARGV[6] -> force: 1 admits now whatever the budget (token_bucket only; see its file), else 0 (reserve)
-- ARGV[7] -> the job's merchant ('' for none): an admission records it in KEYS[#KEYS-4]
-- ARGV[8] -> the settings S: whole numbers >= 0 separated by single spaces, S[1] S[2] ... as below. They
--            change only with the configuration, the live limits or the margin in force, so a function
--            parses each settings string it meets once and keeps the result (up to 64 of them at a time)
-- S[1] -> margin µs (each algorithm says how it applies it)
-- S[2] -> dedup µs: an admitted id is remembered until its slot plus this (> 0; sliding_log: its longest
--          window plus margin, as its log must hold that much)
-- S[3] -> buckets: sub-windows per window (sliding_window); sliding_log: the most members its log keeps,
--          the newest (0: no cap; gate.go sets one under live limits shorter than the log's window), else 0
-- S[4] -> warm-up µs: when KEYS[#KEYS] is missing (the state was lost, say a Redis restart without
--          persistence, or this is the provider's first decision), or was written under another
--          replication history (a failover, a restart from a file), reserve pauses the provider this
--          long before anything is admitted, and announces it on <prefix>:pauses as
--          "<provider> <until_us> <now_us>": a worker holding a reservation decided before now_us
--          holds one the state no longer knows, and must not use it; 0: off
-- S[5] -> pace µs per unit of cost (0: not paced): reserve never gives a slot before the pace's arrival
--          time KEYS[#KEYS-1] less the tolerance, and an admission of cost c at slot s moves that time to
--          max(it, s) + c * pace (a GCRA over slots), so that slots come a pace apart rather than a
--          window's worth at one instant
-- S[6] -> tolerance µs: (burst - 1) * pace
-- S[7] -> max in flight (0: no cap): reserve admits a job only while fewer than this many leases stand
--          (unlapsed members of KEYS[#KEYS-2]), and takes a lease of its own with the admission, in
--          the same step; a cap that is full denies with in_flight 1. Every admission takes a new
--          lease: a redelivery's earlier delivery may still be in flight on the old one
-- S[8] -> lease µs: a lease lapses this long after its slot (the provider's timeout plus a slack), so
--          that a worker that died holding one gives it back by itself
-- S[9] -> the version of the live limits (KEYS[#KEYS-3]'s version, 0 when absent) the caller built the
--          policies below from: when the version in force differs, the call is refused before anything
--          is read or written, with the error "PAYGATE_LIMITS <version in force>"; the caller reads the
--          live limits (limits.lua 'show') and calls again
-- S[10] -> shape: a number naming the layout of the provider's state (gate.go's stateShape: its keys'
--          names, and the windows their contents are named by). The epoch records it: an epoch of
--          another shape means the state began afresh under new names (a change of algorithm, windows,
--          margin or, for the buckets, limits) while the provider still counts what it was sent, and a
--          warm-up is due as after a loss
-- S[11] -> M: how many of the policies below are the merchant's (the last M; 0: none); a job is
--          admitted only at a slot where the provider's policies and the merchant's all have room. The
--          merchant's are counted over its own state (keys above), with the same margin
-- S[12], S[13] -> limit, window µs of policy 0; S[14], S[15] -> policy 1; and so on
--
-- ARGV[1] 'batch' -> several reserves in one call: ARGV[2] = n (1..1000), then for each job 5 arguments
--            (its ARGV[2], ARGV[3], ARGV[4], ARGV[6], ARGV[7] above: id, cost, max wait, force, merchant),
--            then stale (ARGV[5]) and the settings (ARGV[8]), shared. A job id comes at most once a call
--            (a repeated one is its own error reply: gate.go sends it in the next call). The KEYS are the provider's, with no
--            merchant's own (S[11] = 0; a merchant's job goes alone). The provider's state is read once
--            (the jobs' slots in the id record with one ZMSCORE), then each job is decided as its own
--            reserve would be, one after another in the order given, each seeing what the ones before it
--            did, and the writes of all are applied together at the end (one ZADD to the id record, one
--            write of the algorithm's state). The reply is one flat array: now_us (0 when no job was
--            decided), then the n jobs' replies in order, each its error reply, one element (a bad
--            argument; the others go on), or 6 numbers: reserve's below but for now_us, with its flags
--            and policy in the first, {allowed + 2 duplicate + 4 paused + 8 moved + 16 in_flight +
--            32 lease + 128 policy, delay_us, retry_after_us, remaining, admitted_us, reset_after_us}.
--            Redis turns each table, and each number, of a reply into RESP at a cost of its own: one
--            array, and 6 numbers a job instead of a table of 13, took about half a microsecond a job
--            less (BenchmarkReserveBatch). A runtime error (none is known) writes nothing for any of them
--
-- reserve returns {allowed, duplicate, delay_us, retry_after_us, remaining, policy, now_us, paused, admitted_us,
--                  moved, reset_after_us, in_flight, lease} (gate.go names each index):
--   allowed         1: admitted at slot = now + delay_us. 0: denied, nothing changed (but a warm-up begun)
--   duplicate       1: the id is in the id record: it takes nothing and goes at its own slot, the end of a
--                   pause, or now, whichever is latest (denied beyond max wait). Let go, it is marked
--                   in KEYS[3] (id.."\0d"), so that the holder of the first admission can no longer release it
--   delay_us        slot - now when allowed, else 0
--   retry_after_us  when denied (> 0): the same call this much later is admitted if nobody else takes the
--                   room meanwhile (a leaky bucket's full queue counts too); else 0
--   remaining       room left at the slot after this job (the algorithm says what room is), or now when denied
--   policy          0-based index of the policy that sets the slot (or fills the queue), else the tightest
--   now_us          Redis TIME in µs
--   paused          1 when a provider pause is what sets the slot
--   admitted_us     a duplicate's or moved job's old slot, µs; else 0
--   moved           1: the id was in the record at a slot more than stale µs before it would now go, and not
--                   marked sent: its entry left the record, its units went back where the algorithm can give
--                   them back (algo.give_back), and it was admitted afresh, in this one step. Denied afresh,
--                   everything stays as it was. No budget is spent twice, and whichever of the two requests
--                   the provider counts, the record covers it: no later slot can precede the new one.
--   reset_after_us  time until the budget is entirely unused if nothing more is admitted (algo.reset_after)
--   in_flight       1: denied because S[7] leases stand (retry_after_us: until the first lapses; one
--                   usually ends sooner, announced by land.lua); nothing was spent
--   lease           the lease the admission took: 0 none (no cap), 1 id.."\0"..now_us, 2 id.."\0d"..now_us
--                   (a duplicate let go)
-- release returns the number of the id's units that left the record (0: not there, at another slot, or
--   marked in KEYS[3]: a duplicate was let go on it, or its request was sent)
-- depart records that the request of an admission left late: the id's units move from its slot (ARGV[4])
--   to min(slot + late, now), so that the record shows when the provider got it and no later slot is
--   decided as if it had gone on time. Moving an entry later, to no later than now, frees no room for any
--   slot still to be decided (every window they count ends at now or after). Returns the new slot (µs), or
--   0 when nothing moved: the id is not in the record at that slot, late is not past it, or the algorithm
--   keeps no time per unit (only sliding_log defines algo.depart; the others keep the units at the slot).
--   The admission's in-flight lease, while it stands, moves with it (it lapses at the new slot + S[8])
-- postpone is depart for a request that has not left yet: its holder woke too late to use the slot, and
--   asks to go now instead. The units move to now, and only where a reserve now would find the provider
--   open (no pause; no warm-up due: the epoch is there, of this history), a capped job's lease still
--   stands, and every window the move adds the units to keeps room for them (algo.fits_late); else
--   nothing moves (0) and the holder gives the slot back. The pace is not asked: a postponed unit may go
--   between two paced slots
-- merchants returns {now_us, seen, merchant, slot_us, ...}: seen = merchants in KEYS[#KEYS-4] admitted within
--   the last minute (or dedup, if longer), then the newest ARGV[4] of them (name, newest slot), newest first
-- status returns {now_us, paused_until_us, units, leases, used_0, reserved_0, remaining_0, reset_after_us_0,
--   used_1, ...}: units = members of the id record; leases = unlapsed in-flight leases; per policy, as
--   algo.status says
--
-- A decision that fails writes nothing. Every check comes first (a bad argument is an error reply before
-- anything is read; in a batch, a job's bad argument is its own error reply), and every write goes through write(), which only queues it: the queue is applied at
-- the very end, when nothing can fail any more. A denial drops what the decision queued. Reads therefore
-- see the state as it was when the script began; the algorithms keep what they change in Lua, and what
-- they read from Redis after queueing a change (sliding_log's counts) they correct themselves. Big
-- writes are split so that no call passes Lua's unpack limit (8000 values).
--
-- The algorithm's part fills `algo`:
--   algo.init()               set the algorithm's per-call state (see begin), before anything else
--   algo.merchants            true: counts a merchant's policies (S[11] > 0) over keys of its own
--   algo.fcfs                 true: a new slot is never before the newest slot in the id record
--   algo.per_unit             true: the id record holds one member per unit of cost (sliding_log)
--   algo.counters             true: gives units back into counters named by window (counter_undo), only
--                             where the job's marker shows they counted it (see counted_marker)
--   algo.load(trim)           read the state; trim: also drop (queue the deletion of) what no decision can
--                             count any more
--   algo.earliest(from, cost) -> slot (>= from), blocker (1-based policy or nil), hold (µs, > 0 when the
--                             call must be denied whatever its max wait: a full queue)
--   algo.commit(slot, cost)   record an admission of the job ARGV[2] at slot
--   algo.force(at, cost)      record a forced admission at `at` (token_bucket only)
--   algo.give_back(slot, cost) -> a token for take_back, or nil: return the units of the job ARGV[2],
--                             admitted at slot, where that is sound (its record entry is leaving)
--   algo.take_back(token)     undo give_back in Lua (a move denied afresh; its queued writes are dropped)
--   algo.room(at)             -> remaining, index (1-based) of the tightest policy at `at`
--   algo.reset_after()        -> µs until the budget is entirely unused
--   algo.status()             -> {{used, reserved, remaining, reset_after_us}, ...} one per policy
--   algo.save()               queue the writes of what changed, with expiry
--   algo.depart(slot, at, members) (optional) move the job's units, the id record's members (queued
--                             already), from slot to at (slot < at <= now) in the algorithm's own state
--   algo.fits_late(slot, at, n) (with depart) -> whether the job's n units, moved from slot to at, keep
--                             every policy within its limit
--
-- Numbers Redis parses as integers (HSET of counts, PEXPIRE, scores) are formatted with %d; fractions (a
-- token count) with %.17g, which round-trips a double: Lua's own tostring keeps 14 digits.

-- The script runs as a Redis Function where the server has them (gate.go: FUNCTION LOAD once, then FCALL),
-- else with EVALSHA: the same source, with an entry line gate.go appends (paygate(KEYS, ARGV)). As a
-- function, everything at the top level of this file and the algorithm's runs once, when the library is
-- loaded, and lives on between calls. So the top level only defines functions and constants (and reads no
-- global: a library being loaded has only `redis`); every per-call value is one of the locals below, and
-- begin(), begin_job() and start() (or the algorithm's algo.init()) set every one of them at the start of
-- each call: nothing a call sees is left from an earlier one. (Some tables live on between calls, as making
-- them anew on every call was measurable: C, the write queue, the undo state's, the algorithms' arrays.
-- Each says how a call resets it, or reads only what the call itself set.) Lua 5.1 allows a
-- function 60 upvalues; the most any function here uses is 44 (counted by luac5.1 -l -l): a
-- new per-call value with no room left goes into a table (as C) rather than a local of its own.
-- eval_args returns an EVALSHA call's KEYS and ARGV, Redis's globals (defined before the locals below
-- that take their names; a function has no such globals and never calls it).
local function eval_args() return KEYS, ARGV end
-- Lua's globals, as upvalues: a function of a library reads a global through the library's environment, a
-- table whose __index is the globals (two look-ups, measurable at the hundred or so a decision makes),
-- an upvalue at once. A library being loaded reaches none of them, so bind_globals sets them as each call
-- begins (once in a function's life: then math is set; under EVALSHA, on each call). redis stays a
-- global: while the library loads it is another table (register_function's), which the lines gate.go
-- appends use.
local math, string, table, tonumber, tostring, unpack, next, pairs, ipairs, error, type
local function bind_globals()
  local g = _G
  math, string, table, tonumber, tostring, unpack = g.math, g.string, g.table, g.tonumber, g.tostring, g.unpack
  next, pairs, ipairs, error, type = g.next, g.pairs, g.ipairs, g.error, g.type
end
local KEYS, ARGV
local ids, pause, marks, merchants, live, flight, pace_key, epoch
local op, id, merchant
local cost, arg4, stale, forced, margin, dedup, buckets, warmup, pace, tolerance, max_flight, lease, M
local conf, limits, windows, P, PP -- conf: the settings' table (see parse_settings), the algorithm may keep what it derives from them there
-- upto: the policies algo.earliest looks at (1..upto): the provider's first, then all (see run)
local upto
-- provider_counted, merchant_counted: the job being released or moved was counted by the provider's, the
-- merchant's counters in this call's keys (its marker is in the id record; see counted_marker): only then
-- do its units go back there.
local provider_counted, merchant_counted
local now, nwrites, seen_for
local newest_read, newest_value -- newest_slot's cache
local kept, standing -- reserve's: writes a denial keeps; in-flight leases standing
local reset_memo -- reset_after's
-- C: what a reserve call's jobs share beyond the above (start resets it): got[job] = the slot in the record
-- of the batch's job-th id as the call began (ZMSCORE's reply, false: not there; a batch's ids are
-- distinct and read at once; nil for a single call, whose lookup reads its own), ttl[key] = the expiry
-- finish keeps key at least (ms), rec[1..nrec] = the record's new members (score, member, ...), slot and
-- score = the slot record formatted last and its string (a batch's jobs mostly share one), admitted, last =
-- the latest slot admitted, pause_until, tat = the pace's arrival time, first_lease = the earliest lapse of
-- a lease taken, renew_flight: the in-flight set may be emptied by the call's removal of lapsed leases
-- (its expiry then goes with it, and finish sets it anew), p and m: counted_marker's hashes of this call's
-- keys. jc, j4, jf, jm are begin_job's, out and nout a batch's reply (begin forgets them: they are set
-- before start). One table lives on between a function's calls (making it anew on every call was
-- measurable): start (or begin) sets every field, and makes ttl anew only when the call before used it.
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
  conf, C.jc, C.out = c, nil, nil
  margin, dedup, buckets, warmup, pace, tolerance = c.margin, c.dedup, c.buckets, c.warmup, c.pace, c.tolerance
  max_flight, lease, M, limits, windows, P = c.max_flight, c.lease, c.M, c.limits, c.windows, c.P
  PP = P - M -- the provider's policies are 1..PP; the merchant's PP+1..P
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
  -- A batch's jobs mostly share these four: parsed and checked again only when they change (C.jc..C.jm,
  -- the last good ones of the call; begin forgets them).
  if cost_arg ~= C.jc or arg4_arg ~= C.j4 or force_arg ~= C.jf or merchant_arg ~= C.jm then
    C.jc = nil
    local err = job_args(cost_arg, arg4_arg, force_arg, merchant_arg)
    if err then return err end
    C.jc, C.j4, C.jf, C.jm = cost_arg, arg4_arg, force_arg, merchant_arg
  end
  upto, provider_counted, merchant_counted, reset_memo = PP, false, false, nil
  return nil
end

-- The queue of writes (see the header): the commands' arguments one after another in wq (wq[1..wtop]),
-- write k's from wq[ws[k]] (a table per write was measurable). inject_at is for tests only: gate's
-- TestFailedDecisionWritesNothing rewrites this line to raise an error at the n-th write queued, and
-- checks that nothing was written.
local inject_at = 0
local wq, ws, wtop = {}, {}, 0
local function start_writes()
  nwrites, wtop = 0, 0
  if #ws > 1024 then wq, ws = {}, {} end -- a big batch's: not kept for ever
end
-- open_write queues a write of cmd key, whose further arguments the caller appends: wq[wtop + 1], ...,
-- moving wtop past them.
local function open_write(cmd, key)
  nwrites = nwrites + 1
  if nwrites == inject_at then error('paygate: injected failure at write ' .. inject_at) end
  local t = wtop
  ws[nwrites], wq[t + 1], wq[t + 2], wtop = t + 1, cmd, key, t + 2
end
-- write queues cmd key, then up to 4 arguments (none nil but the unused last ones).
local function write(cmd, key, a, b, c, d)
  open_write(cmd, key)
  local t = wtop
  if a ~= nil then t = t + 1; wq[t] = a end
  if b ~= nil then t = t + 1; wq[t] = b end
  if c ~= nil then t = t + 1; wq[t] = c end
  if d ~= nil then t = t + 1; wq[t] = d end
  wtop = t
end
-- write_range queues cmd key, then list[i..j] as its arguments.
local function write_range(cmd, key, list, i, j)
  open_write(cmd, key)
  local t = wtop
  for k = i, j do wq[t + 1], t = list[k], t + 1 end
  wtop = t
end
-- drop_writes drops the writes queued after the first k.
local function drop_writes(k)
  if nwrites > k then nwrites, wtop = k, ws[k + 1] - 1 end
end

local function start()
  -- The live limits: decided under limits that are no longer in force, the call is refused (see S[9]).
  local version = redis.call('HGET', live, 'version') or '0'
  if version ~= conf.version then return redis.error_reply('PAYGATE_LIMITS ' .. version) end

  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  start_writes()
  -- seen_for: how long the registry of merchants (KEYS[#KEYS-4]) keeps a merchant after its newest slot
  seen_for = math.max(dedup, 60000000)
  newest_read, newest_value, kept, standing, reset_memo = false, nil, 0, 0, nil
  C.got, C.job = nil, 0
  if next(C.ttl) ~= nil then C.ttl = {} end
  if C.nrec > 4096 then C.rec = {} end -- a big batch's: not kept for ever
  C.nrec, C.admitted, C.last, C.pause_until, C.tat, C.first_lease, C.renew_flight = 0, false, 0, 0, 0, nil, false
  C.p, C.m = nil, nil -- counted_marker's hashes: this call's keys
  C.slot, C.score = nil, nil
  return nil
end

-- write_members queues cmd key then members (for ZADD a score before each), split into calls of at most
-- 2000 arguments after the key.
local function write_members(cmd, key, members, score)
  local n = #members
  if n == 1 then -- the common case: a job of cost 1
    if score then return write(cmd, key, score, members[1]) end
    return write(cmd, key, members[1])
  end
  if not score then
    for j = 1, n, 2000 do write_range(cmd, key, members, j, math.min(j + 1999, n)) end
    return
  end
  for j = 1, n, 1000 do
    open_write(cmd, key)
    local t = wtop
    for k = j, math.min(j + 999, n) do wq[t + 1], wq[t + 2], t = score, members[k], t + 2 end
    wtop = t
  end
end
local function flush()
  ws[nwrites + 1] = wtop + 1
  for k = 1, nwrites do redis.call(unpack(wq, ws[k], ws[k + 1] - 1)) end
  return true
end

local EPS = 1e-9 -- fractions of a unit this small are rounding, not room

local function int(x) return string.format('%d', x) end

-- history names the replication history of the data this server holds: INFO's master_replid. Promoting
-- a replica (a failover), restarting from an RDB or AOF file, or any other way a server comes to hold a
-- copy that may lag what its primary acknowledged begins a new one. A function reads it at most once a
-- second (Redis clock) and keeps it between calls; EVALSHA reads it on each reserve. It is '' where INFO
-- is refused (an ACL without +info) or has no such field (miniredis): the history check is then off.
local history, history_at = '', nil
local function current_history()
  if not history_at or now - history_at >= 1000000 or now < history_at then
    local info = redis.pcall('INFO', 'replication')
    local h = type(info) == 'string' and string.match(info, 'master_replid:(%w+)')
    if not h then return '' end -- refused (this caller's ACL) or absent: not kept, the next caller reads it
    history, history_at = h, now
  end
  return history
end
-- epoch_state reads the epoch's value (KEYS[#KEYS], false when missing) against this server's history and
-- the state's shape: whether a warm-up is due (no epoch: the state was lost, or this is the first
-- decision; an epoch of another shape: the state began afresh under other names; or one written under
-- another history), and the history to write it with when it needs writing without one (it lacks the
-- shape, or this server's history: it takes them; nil: it needs no writing). Also this server's history.
local function epoch_state(began)
  local h = current_history()
  if not began then return true, nil, h end
  local was, shape = string.match(began, '^%d+ (%w+)'), string.match(began, ' @(%d+)$')
  if (shape and shape ~= conf.shape) or (was and h ~= '' and was ~= h) then return true, nil, h end
  if h ~= '' and was ~= h then return false, h, h end
  if not shape then return false, was or '', h end
  return false, nil, h
end
-- epoch_value is the epoch's value for a state begun at began_us under history h.
local function epoch_value(began_us, h) return began_us .. ' ' .. h .. ' @' .. conf.shape end
-- num formats a number exactly, as %.17g does: a whole one below 1e17 (but -0) as int does, which prints
-- the same digits at a third of the cost; others with 17 significant digits.
local function num(x)
  if x % 1 == 0 and x > -1e17 and x < 1e17 and (x ~= 0 or 1 / x > 0) then return string.format('%d', x) end
  return string.format('%.17g', x)
end

local function expire(key, ms) write('PEXPIRE', key, int(math.ceil(ms))) end
-- keep_until keeps key at least until the instant until_us and a second (its expiry is only extended).
local function keep_until(key, until_us)
  local ttl = math.ceil((until_us - now) / 1000) + 1000
  if redis.call('PTTL', key) < ttl then write('PEXPIRE', key, int(ttl)) end
end

local algo = {}

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

-- counters_read reads a counter hash (field: a window's or bucket's index; value: its units) into the
-- flat arrays k_ and c_ (kept by the algorithm between calls) and returns how many it holds; with trim,
-- the fields below floor are deleted instead (split: thousands may have piled up). For the counters
-- (sliding_window, fixed_window).
local function counters_read(key, floor, trim, k_, c_)
  local n, drop = 0, nil
  local got = redis.call('HGETALL', key)
  for j = 1, #got, 2 do
    local k = tonumber(got[j])
    if trim and k < floor then
      drop = drop or {}
      drop[#drop + 1] = got[j]
    else
      n = n + 1
      k_[n], c_[n] = k, tonumber(got[j + 1])
    end
  end
  if drop then write_members('HDEL', key, drop) end
  return n
end

-- counters_find is the position of index k among the first n of k_, or nil.
local function counters_find(k_, n, k)
  for j = 1, n do
    if k_[j] == k then return j end
  end
  return nil
end

-- counter_undo is give_back and take_back for the counters (sliding_window, fixed_window), over their
-- index_of(i, slot) (bucket or window), count(i, k), add(i, k, n) and keep(i) (sets the hash's expiry).
-- give_back takes a job's units out of the counter its slot fell in, while that counter still counts;
-- take_back puts them back (a denied move) and sets the expiry again: give_back may have emptied the
-- hash (HDEL of its last field deletes the key), and HSET makes it anew without one.
local function counter_undo(index_of, count, add, keep)
  local function give_back(slot, n)
    local taken = {}
    for i = 1, P do
      local k = index_of(i, slot)
      if count(i, k) > 0 and ((i <= PP and provider_counted) or (i > PP and merchant_counted)) then
        taken[i] = {k, math.min(n, count(i, k))}
        add(i, k, -taken[i][2])
      end
    end
    return taken
  end
  local function take_back(taken)
    for i, x in pairs(taken or {}) do
      add(i, x[1], x[2])
      keep(i)
    end
  end
  return give_back, take_back
end

-- undoable is the state of token_bucket, gcra and leaky_bucket: one hash of numbers (v:<name>, for the
-- given names) and the undo record of the newest admission (last = its id, last_slot, u:<name> = the
-- numbers before it), so that a release or move of that admission restores exactly what it changed. An
-- older admission cannot be undone soundly: later ones were decided on top of it. A call has one such
-- state, U: its functions are made once, undoable() sets its fields for the call. names is a table kept in
-- the settings' table (conf): the field names are built once per settings, v:* read with one HMGET. U.v
-- and U.u hold nothing but names' numbers: the two tables a call starts with live on between a function's
-- calls (undoable empties them), and begin copies into U.u in place (making them anew was measurable).
-- The strings load read for v:<name> (read[name]) serve save again for u:<name> while U.u holds the numbers
-- as read (U.as_read: the call's first begin copied a state nothing had changed yet, U.fresh), instead
-- of formatting them anew: num's string for the number a string of num's reads back as is that string.
local U = {}
local vbuf, ubuf, read = {}, {}, {}
-- copy_into sets to[name] = from[name] for every name, and returns to.
local function copy_into(to, from)
  local names = U.names
  for j = 1, #names do
    local name = names[j]
    to[name] = from[name]
  end
  return to
end
-- load reads last, last_slot and v:* only: the undo record's numbers (u:*) matter to give_back alone (an
-- admission's begin replaces them first), which reads them then (U.u_known: U.u holds them, as read or as
-- this call set them). Until a write of the call's is applied, Redis holds them as the call began.
function U.load()
  local got = redis.call('HMGET', U.key, unpack(U.names.vfields))
  U.last, U.last_slot = got[1] or '', tonumber(got[2] or 0)
  local names, v = U.names, U.v
  for j = 1, #names do
    local name, s = names[j], got[2 + j] or nil
    v[name], read[name] = tonumber(s), s
  end
  U.fresh, U.u_known = true, false
end
-- begin records the numbers as they are before an admission at slot (which changes U.v next).
function U.begin(slot)
  copy_into(U.u, U.v)
  U.last, U.last_slot, U.dirty, U.as_read, U.fresh, U.u_known = id, slot, true, U.fresh, false, true
end
function U.give_back(slot)
  if U.last ~= id or U.last_slot ~= slot then return nil end
  if not U.u_known then
    local got, names, u = redis.call('HMGET', U.key, unpack(U.names.uf)), U.names, U.u
    for j = 1, #names do u[names[j]] = tonumber(got[j] or nil) end
    U.u_known = true
  end
  local token = {v = U.v, u = U.u, last = U.last, last_slot = U.last_slot, as_read = U.as_read, fresh = U.fresh}
  U.v, U.u, U.last, U.last_slot, U.dirty, U.as_read, U.fresh = copy_into({}, U.u), {}, '', 0, true, false, false
  return token
end
function U.take_back(token)
  if token then
    U.v, U.u, U.last, U.last_slot, U.as_read, U.fresh = token.v, token.u, token.last, token.last_slot, token.as_read, token.fresh
  end
end
-- save writes every field (last = '' means no undo; u:* are then ignored), and deletes the numbers that
-- are no more: undoing the first admission after an idle spell restores "no state", a full bucket. Both
-- are built in the write queue itself.
function U.save(ttl_ms)
  if not U.dirty then return end
  local names, v, u = U.names, U.v, U.u
  local vf, uf, n = names.vf, names.uf, #names
  local gone = false
  for j = 1, n do
    local name = names[j]
    if not v[name] or not u[name] then gone = true end
  end
  if gone then
    open_write('HDEL', U.key)
    local t = wtop
    for j = 1, n do
      local name = names[j]
      if not v[name] then wq[t + 1], t = vf[j], t + 1 end
      if not u[name] then wq[t + 1], t = uf[j], t + 1 end
    end
    wtop = t
  end
  open_write('HSET', U.key)
  local t = wtop
  wq[t + 1], wq[t + 2], wq[t + 3], wq[t + 4], t = 'last', U.last, 'last_slot', int(U.last_slot), t + 4
  local as_read = U.as_read
  for j = 1, n do
    local name = names[j]
    local x, y = v[name], u[name]
    if x then wq[t + 1], wq[t + 2], t = vf[j], num(x), t + 2 end
    if y then
      if as_read then y = read[name] else y = num(y) end
      wq[t + 1], wq[t + 2], t = uf[j], y, t + 2
    end
  end
  wtop = t
  expire(U.key, ttl_ms)
end
local function undoable(key, names)
  if not names.vfields then
    local vf, uf, vfields = {}, {}, {'last', 'last_slot'}
    for j, name in ipairs(names) do
      vf[j], uf[j] = 'v:' .. name, 'u:' .. name
      vfields[j + 2] = vf[j]
    end
    names.vf, names.uf, names.vfields = vf, uf, vfields
  end
  if U.names ~= names then vbuf, ubuf, read = {}, {}, {} end -- other names: no field of the last call's stays
  U.key, U.names, U.v, U.u, U.last, U.last_slot, U.dirty, U.as_read, U.fresh = key, names, vbuf, ubuf, '', 0, false, false, false
  for j = 1, #names do
    local name = names[j]
    vbuf[name], ubuf[name], read[name] = nil, nil, nil
  end
  return U
end

-- arrivals is gcra's and leaky_bucket's theoretical arrival time (TAT) per policy, kept exactly as q + r/L µs
-- (q whole, 0 <= r < L) in an undoable state (field v:<W µs> = q, v:<W µs>:r = r). T = (W + m) / L is rarely a
-- whole number of µs, and a double at today's clock holds µs only to 0.25: adding T as a double drifts, or
-- rounds a fraction below 1/8 away. With W + m = a*L + b, n*T = n*a + n*b/L is added in whole numbers, exact
-- while n*b < 2^53 (limits below 9.4e7). Only room and status figures, which decide nothing, use doubles.
-- As with U, a call has one, X: arrivals() sets its state and what follows from the settings (kept there).
-- X.state is U; X's functions read U.v, and xA, xB, xqn, xrn: X.A, X.B, X.qn, X.rn, kept as upvalues.
local X = {}
local xA, xB, xqn, xrn
-- q, r: policy i's TAT (a q stored as a fraction by an older version is rounded up).
local function xq(i)
  local x = U.v[xqn[i]] or 0
  if x % 1 ~= 0 then x = math.ceil(x) end
  return x
end
local function xr(i) return U.v[xrn[i]] or 0 end
X.q, X.r = xq, xr
function X.tat(i) return xq(i) + xr(i) / limits[i] end
-- plus returns q', r' of (q0 + r0/L) + n*T.
local function xplus(i, q0, r0, n)
  local y, l = r0 + n * xB[i], limits[i]
  return q0 + n * xA[i] + math.floor(y / l), y % l
end
X.plus = xplus
-- ceil_tat is the TAT rounded up to the µs.
function X.ceil_tat(i)
  if xr(i) > 0 then return xq(i) + 1 end
  return xq(i)
end
-- advance sets TAT = max(TAT, slot) + n*T.
function X.advance(i, slot, n)
  local q0, r0 = xq(i), xr(i)
  if slot > q0 or (slot == q0 and r0 == 0) then q0, r0 = slot, 0 end
  local v = U.v
  v[xqn[i]], v[xrn[i]] = xplus(i, q0, r0, n)
end
local function arrivals(key)
  local c = conf.arrivals
  if not c then
    c = {A = {}, B = {}, T = {}, qn = {}, rn = {}, names = {}}
    for i = 1, P do
      local d = windows[i] + margin
      c.A[i], c.B[i], c.T[i] = math.floor(d / limits[i]), d % limits[i], d / limits[i]
      c.qn[i], c.rn[i] = int(windows[i]), int(windows[i]) .. ':r'
      c.names[#c.names + 1], c.names[#c.names + 2] = c.qn[i], c.rn[i]
    end
    conf.arrivals = c
  end
  X.A, X.B, X.T, X.qn, X.rn = c.A, c.B, c.T, c.qn, c.rn
  xA, xB, xqn, xrn = c.A, c.B, c.qn, c.rn
  X.state = undoable(key, c.names)
  return X
end

-- units_at lists the id's members at one score, and the units they stand for: their number when the record
-- holds one per unit, else the cost its "\0n" member names (the largest k of id.."\0"..k serves both).
local function units_at(at)
  local out, n, prefix = {}, 1, id .. '\0'
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', ids, int(at), int(at))) do
    if m == id then
      out[#out + 1] = m
    elseif string.sub(m, 1, #prefix) == prefix then
      out[#out + 1] = m
      n = math.max(n, tonumber(string.sub(m, #prefix + 1)) or 1)
    end
  end
  return out, n
end

-- newest_slot is the newest slot in the record: read once, as the call began, then moved by the call's
-- own admissions (first come, first served: a batch's next job is never before them).
local function newest_slot()
  if not newest_read then
    newest_value = tonumber(redis.call('ZREVRANGE', ids, 0, 0, 'WITHSCORES')[2] or nil)
    newest_read = true
  end
  return newest_value
end

-- put_members names the id's members for an admission of cost n into buf after position k, each after
-- score unless it is nil, and returns the new end: the id for the first unit, then id\0u for each unit u
-- (algo.per_unit) or id\0n for the rest together.
local function put_members(buf, k, n, score)
  local last = math.max(n, 1)
  if not algo.per_unit then last = math.min(last, 2) end
  for u = 1, last do
    if score then buf[k + 1], k = score, k + 1 end
    if u == 1 then
      buf[k + 1] = id
    elseif algo.per_unit then
      buf[k + 1] = id .. '\0' .. u
    else
      buf[k + 1] = id .. '\0' .. n
    end
    k = k + 1
  end
  return k
end

-- members_of names the id's members for an admission of cost n.
local function members_of(n)
  local members = {}
  put_members(members, 0, n)
  return members
end

-- extend asks finish to keep key at least ttl_ms from now (one PTTL and at most one PEXPIRE per key and
-- call, whatever the number of jobs that asked).
local function extend(key, ttl_ms)
  if ttl_ms > (C.ttl[key] or 0) then C.ttl[key] = ttl_ms end
end

-- mark queues a mark on the id (kind 's': sent, 'd': a duplicate let go), kept for ttl_us: at least as
-- long as the record keeps the id. The marks whose time is past go with it: the set holds only what the
-- record may still ask about.
local function mark(kind, ttl_us)
  write('ZADD', marks, int(now + ttl_us), id .. '\0' .. kind)
  write('ZREMRANGEBYSCORE', marks, '-inf', '(' .. int(now))
  extend(marks, math.ceil(ttl_us / 1000) + 1000)
end

-- counted_marker is the id record's member that marks an admission counted by the keys KEYS[first..last]
-- (tag 'p': the provider's counters; 'm': the merchant's), named by a hash of those keys (made once a
-- call, kept in C[tag]). Only the counters (algo.counters: sliding_window, fixed_window) need it: they
-- give a job's units back by its slot, into counters named by window, so that after a change of windows
-- (configured, or live) the counters in force may be others than those the job went into; a release or
-- move gives back only to keys its marker names. nil for the other algorithms, and when there are no such
-- keys. (sliding_log's merchant log is its own record; the buckets' undo record is in their state.)
local function counted_marker(tag, first, last)
  if not algo.counters or last < first then return nil end
  local h = C[tag]
  if not h then
    local mk = {}
    for i = first, last do mk[#mk + 1] = KEYS[i] end
    h = string.sub(redis.sha1hex(table.concat(mk, '|')), 1, 16)
    C[tag] = h
  end
  return id .. '\0' .. tag .. h
end
local function provider_marker() return counted_marker('p', 4, 3 + PP) end
local function merchant_marker() return counted_marker('m', 4 + PP, 3 + P) end

-- record puts the id's members for an admission of cost n (members_of's, then under the counters the
-- markers of the keys that counted it: see counted_marker) into the record at slot: finish adds the call's
-- in one ZADD and sets the record's expiry once, from the call's latest slot. Every slot in the record is
-- at most reset_after from now (the newest admission is what sets it), so that expiry never cuts a later
-- entry short.
local function record(slot, n)
  local rec, score = C.rec, C.score
  if slot ~= C.slot then score = int(slot); C.slot, C.score = slot, score end
  local k = C.nrec
  if n == 1 then
    rec[k + 1], rec[k + 2], k = score, id, k + 2
  else
    k = put_members(rec, k, n, score)
  end
  if algo.counters then
    local pm, mm = provider_marker(), merchant_marker()
    if pm then rec[k + 1], rec[k + 2], k = score, pm, k + 2 end
    if mm then rec[k + 1], rec[k + 2], k = score, mm, k + 2 end
  end
  C.nrec = k
  if slot > C.last then C.last = slot end
end

-- holds tells whether members (units_at's) include marker.
local function holds(members, marker)
  if not marker then return false end
  for _, m in ipairs(members) do
    if m == marker then return true end
  end
  return false
end

-- What no duplicate check needs any more is trimmed by every call that writes the record (an id found
-- older than that is taken as gone meanwhile).
local function trim() write('ZREMRANGEBYSCORE', ids, '-inf', string.format('(%d', now - dedup)) end

-- lookup finds the id in the record: its slot (nil: not there, or older than dedup) and, when there, its
-- mark in the sent hash (false: none). A batch's ids are distinct, so no earlier job of the call changed
-- either. Marks matter only to an id in the record (a mark left from an earlier life of an id that has left the
-- record since is harmless: it can only refuse a release, which keeps a unit spent, never too few).
local function lookup()
  local prev
  if C.got then prev = C.got[C.job] else prev = redis.call('ZSCORE', ids, id) end
  prev = prev and tonumber(prev) or nil
  if prev and prev < now - dedup then prev = nil end
  if not prev then return nil, false end
  local got = redis.call('ZMSCORE', marks, id .. '\0s', id .. '\0d')
  if tonumber(got[1] or nil) and tonumber(got[1]) >= now then return prev, 's' end
  if tonumber(got[2] or nil) and tonumber(got[2]) >= now then return prev, 'd' end
  return prev, false
end

-- lease_of is the in-flight lease the id's admission at slot took (S[7] > 0), while it stands: nil when
-- there is no cap, or it lapsed (its place may have gone to another job since), or it has gone.
local function lease_of(slot)
  if max_flight == 0 or now >= slot + lease then return nil end
  local prefix = id .. '\0'
  local at = int(slot + lease)
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', flight, at, at)) do
    -- the admission's own: id.."\0"..now_us (a duplicate's is id.."\0d"..now_us)
    if string.sub(m, 1, #prefix) == prefix and string.find(m, '^%d', #prefix + 1) then return m end
  end
  return nil
end

-- may_postpone tells whether the admission of n units at slot may go at `at` (now) instead: as a reserve
-- now would find it, the provider is not paused, its state is not lost or from another history (the
-- warm-up: a reserve begins it, this refuses), a capped job still holds its lease (held), and every
-- window the move adds the units to has room for them (algo.fits_late). The pace is not asked: the
-- unit keeps its place in it, and may go between two paced slots; the windows stay exact.
local function may_postpone(slot, at, n, held)
  if max_flight > 0 and not held then return false end
  local got = redis.call('MGET', pause, epoch)
  if tonumber(got[1] or 0) > now or (warmup > 0 and epoch_state(got[2])) then return false end
  return algo.fits_late(slot, at, n)
end

-- A reserve's replies. deny drops the writes the job queued (since `kept`, set as it begins): the call's
-- own (the trim, a warm-up, the lapsed leases' removal) and the jobs' before it stay.
local function deny(r)
  drop_writes(kept)
  return r
end
-- reply returns the 13 numbers in a table of their own, or, in a batch, appends the job's 6 (see the
-- header) to the call's reply (C.out, of C.nout values so far) and returns it.
local function reply(allowed, dup, delay, retry, room, index, paused, admitted, moved, in_flight, leased)
  local reset = math.max(0, math.ceil(reset_after()))
  in_flight, leased = in_flight or 0, leased or 0
  local r, k = C.out, C.nout
  if not r then return {allowed, dup, delay, retry, room, index - 1, now, paused, admitted, moved, reset, in_flight, leased} end
  r[k + 1] = allowed + 2 * dup + 4 * paused + 8 * moved + 16 * in_flight + 32 * leased + 128 * (index - 1)
  r[k + 2], r[k + 3], r[k + 4], r[k + 5], r[k + 6] = delay, retry, room, admitted, reset
  C.nout = k + 6
  return r
end
local function lease_free() return max_flight == 0 or standing < max_flight end
-- take_lease queues a lease, lapsing at slot + lease: its member is id..tag..now_us (tag '\0', or '\0d' for
-- a duplicate let go), made only when there is a cap.
local function take_lease(tag, slot)
  if max_flight == 0 then return end
  write('ZADD', flight, int(slot + lease), id .. tag .. int(now))
  standing = standing + 1
  if not C.first_lease or slot + lease < C.first_lease then C.first_lease = slot + lease end
  extend(flight, math.ceil((slot + lease - now) / 1000) + 1000)
end
-- flight_full is the denial of a job the cap holds back: retry when the first lease lapses.
local function flight_full(dup, admitted)
  local first = redis.call('ZRANGEBYSCORE', flight, '(' .. int(now), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  local lapse = tonumber(first[2] or nil) or C.first_lease or (now + 1)
  if C.first_lease and C.first_lease < lapse then lapse = C.first_lease end
  local room, index = algo.room(now)
  return deny(reply(0, dup, 0, math.max(1, lapse - now), room, index, 0, admitted, 0, 1, 0))
end

-- prepare reads what a reserve needs beside the algorithm's state, once per call: the pause and the pace,
-- the epoch (a warm-up begins here), the in-flight leases.
local function prepare()
  -- The pause, the pace's arrival time and the epoch, in one read (the pause alone when neither of the
  -- others is in use).
  local paused, paced, began = false, false, false
  if pace > 0 or warmup > 0 then
    local got = redis.call('MGET', pause, pace_key, epoch)
    paused, paced, began = got[1], got[2], got[3]
  else
    paused = redis.call('GET', pause)
  end
  C.pause_until, C.tat = tonumber(paused or 0), 0
  if pace > 0 then C.tat = tonumber(paced or 0) end
  -- Warm-up: no epoch means the state may have lost what the provider still counts; so does an epoch
  -- written under another replication history (see current_history): the state survived a failover or a
  -- restart, but what was admitted after its last copy was taken may not have. Hold the provider until
  -- nothing admitted or reserved before the loss can share a window with what is admitted after it. It
  -- stands whatever this decision's verdict. An epoch without a history (written where INFO was refused,
  -- or by an earlier version) takes this server's, without a warm-up.
  began = warmup > 0 and began
  local due, stamp, h = false, nil, ''
  if warmup > 0 then due, stamp, h = epoch_state(began) end
  if due then
    write('SET', epoch, epoch_value(int(now), h))
    if now + warmup > C.pause_until then
      C.pause_until = now + warmup
      write('SET', pause, int(C.pause_until), 'PX', int(math.ceil(warmup / 1000) + 1000))
    end
    local prefix, name = string.match(epoch, '^(.*):{([^}]*)}:epoch$')
    write('PUBLISH', prefix .. ':pauses', name .. ' ' .. int(C.pause_until) .. ' ' .. int(now))
  elseif stamp then
    write('SET', epoch, epoch_value(string.match(began, '^%d+') or int(now), stamp))
  end
  -- In-flight leases: the lapsed ones go (their workers died, or never ended them); an admission needs one
  -- of the max_flight.
  if max_flight > 0 then
    write('ZREMRANGEBYSCORE', flight, '-inf', int(now))
    standing = redis.call('ZCOUNT', flight, '(' .. int(now), '+inf')
    -- With none standing the removal may delete the key, and its expiry: the next lease's ZADD makes it
    -- anew without one, so finish sets the expiry whatever PTTL said. With one standing, the key's expiry
    -- already covers it (every lease extends it; land.lua only removes members).
    C.renew_flight = standing == 0
  end
end

-- reserve decides the job begin_job set, after prepare and the jobs of the call before it, and returns its
-- reply (in a batch, the call's, which it appends to: see reply). Its writes are queued; finish applies
-- the call's.
local function reserve()
  kept = nwrites
  local prev, marked = lookup()
  local max_wait, pause_until, tat = arg4, C.pause_until, C.tat
  local moved, old, token = 0, 0, nil
  if prev and stale > 0 and math.max(now, pause_until) - prev > stale and marked ~= 's' then
    -- Stale: its earlier delivery may never have sent its request. Its units leave the record (and go back
    -- where the algorithm can give them back); it is admitted afresh below, or everything stays. (A slot
    -- of this call's is never stale: it is at least now.)
    moved, old = 1, prev
    local gone, n = units_at(prev)
    write_members('ZREM', ids, gone)
    provider_counted, merchant_counted = holds(gone, provider_marker()), holds(gone, merchant_marker())
    token = algo.give_back(prev, n)
    reset_memo = nil
  elseif prev then
    -- A duplicate holds its permit already: it goes at its own slot, after a pause, or now, whichever is
    -- latest, within max wait like any job.
    local at, paused = math.max(prev, now), 0
    if pause_until > at then at, paused = pause_until, 1 end
    local room, index = algo.room(at)
    if at - now > max_wait then return deny(reply(0, 1, 0, at - now - max_wait, room, index, paused, prev, 0)) end
    -- Let go, a duplicate is a request of its own in flight: it needs a lease of its own.
    if not lease_free() then return flight_full(1, prev) end
    take_lease('\0d', at)
    if marked ~= 's' then mark('d', math.max(at - now, 0) + dedup) end -- sent says more: keep it
    local leased = 0
    if max_flight > 0 then leased = 2 end
    return reply(1, 1, at - now, 0, room, index, paused, prev, 0, 0, leased)
  end

  if not lease_free() then
    if moved == 1 then algo.take_back(token); reset_memo = nil end -- denied: the units and the entry stay where they were
    return flight_full(0, old)
  end
  local from = math.max(now, pause_until)
  if pace > 0 and not forced then from = math.max(from, tat - tolerance) end
  local slot, blocker, hold = from, nil, 0
  if not forced then
    -- First come, first served: not before the record's newest slot. Paced one at a time, the pace's
    -- arrival time is already past every slot in the record (each admission moves it past its own slot).
    if algo.fcfs and not (pace > 0 and tolerance == 0 and tat > 0) then
      local tail = newest_slot()
      if tail then from = math.max(from, tail) end
    end
    slot, blocker, hold = algo.earliest(from, cost)
  end
  local merchant_bound = false
  if M > 0 and not forced and hold == 0 then
    -- The merchant's policies from the provider's slot on. A slot only the merchant's limits push later
    -- is not reserved: held there, it would move the first-come-first-served floor and the pace past
    -- every other merchant's jobs. The job is denied until then, spending nothing.
    upto = P
    local s, b, h = algo.earliest(slot, cost)
    if s > slot or h > 0 then slot, blocker, hold, merchant_bound = s, b, h, true end
  end
  local paused = 0
  if pause_until > now and slot == pause_until then paused = 1 end
  local wait = slot - now
  if merchant_bound or wait > max_wait or hold > 0 then
    if merchant_bound then wait = math.max(wait, 1) + max_wait end -- retry when the merchant has room
    if moved == 1 then algo.take_back(token); reset_memo = nil end -- denied: the units and the entry stay where they were
    local room, index = algo.room(now)
    return deny(reply(0, 0, 0, math.max(wait - max_wait, hold), room, blocker or index, paused, old, 0))
  end
  if forced then algo.force(slot, cost) else algo.commit(slot, cost) end
  reset_memo = nil
  C.admitted = true
  if pace > 0 then C.tat = math.max(tat, slot) + cost * pace end
  if newest_read and (not newest_value or slot > newest_value) then newest_value = slot end
  record(slot, cost)
  if merchant ~= '' then
    write('ZADD', merchants, 'GT', int(slot), merchant)
    write('ZREMRANGEBYSCORE', merchants, '-inf', '(' .. int(now - seen_for))
    expire(merchants, (math.max(slot - now, reset_after()) + seen_for) / 1000 + 1000)
  end
  take_lease('\0', slot)
  local leased = 0
  if max_flight > 0 then leased = 1 end
  local room, index = algo.room(slot)
  return reply(1, 0, wait, 0, room, blocker or index, paused, old, moved, 0, leased)
end

-- finish queues the call's shared writes (the algorithm's state, the pace, the record's trim and expiry,
-- the expiries extend asked for) and applies the queue. Nothing can fail after it begins.
local function finish()
  if C.admitted then
    trim()
    local rec, n = C.rec, C.nrec
    for j = 1, n, 2000 do write_range('ZADD', ids, rec, j, math.min(j + 1999, n)) end
    algo.save()
    if pace > 0 then write('SET', pace_key, int(C.tat), 'PX', int(math.ceil((C.tat - now) / 1000) + 1000)) end
    expire(ids, (math.max(C.last - now, reset_after()) + dedup) / 1000 + 1000)
  end
  for key, ttl in pairs(C.ttl) do
    if (key == flight and C.renew_flight) or redis.call('PTTL', key) < ttl then write('PEXPIRE', key, int(ttl)) end
  end
  return flush()
end

local function run()
  if M > 0 and not algo.merchants then return bad('merchant limits are not counted by this algorithm; merchant policies', M) end
  if op == 'merchants' then
    local since = '(' .. int(now - seen_for)
    local reply = {now, redis.call('ZCOUNT', merchants, since, '+inf')}
    if arg4 > 0 then
      local got = redis.call('ZREVRANGEBYSCORE', merchants, '+inf', since, 'WITHSCORES', 'LIMIT', 0, arg4)
      for j = 1, #got, 2 do reply[#reply + 1], reply[#reply + 2] = got[j], tonumber(got[j + 1]) end
    end
    return reply
  end
  if op == 'status' then
    algo.load(false)
    local pause_until = tonumber(redis.call('GET', pause) or 0)
    if pause_until <= now then pause_until = 0 end
    local reply = {now, pause_until, redis.call('ZCARD', ids), redis.call('ZCOUNT', flight, '(' .. int(now), '+inf')}
    for _, s in ipairs(algo.status()) do
      for _, v in ipairs(s) do reply[#reply + 1] = v end
    end
    return reply
  end

  if op == 'depart' or op == 'postpone' then
    if not algo.depart then return 0 end
    local prev = lookup()
    local at = now -- postpone: about to leave
    if op == 'depart' then at = math.min(arg4 + stale, now) end
    if not prev or prev ~= arg4 or at <= prev then return 0 end
    local members = units_at(prev)
    local held = lease_of(prev)
    if op == 'postpone' and not may_postpone(prev, at, #members, held) then return 0 end
    write_members('ZADD', ids, members, int(at))
    algo.depart(prev, at, members)
    keep_until(ids, at + dedup)
    if held then
      -- The lease follows the request: it lapses its slack after the request began, as it would have.
      write('ZADD', flight, 'XX', int(at + lease), held)
      keep_until(flight, at + lease)
    end
    flush()
    return at
  end
  algo.load(true)
  if op == 'release' then
    local prev, marked = lookup()
    if not prev or (arg4 ~= 0 and prev ~= arg4) or marked then return 0 end
    local gone, n = units_at(prev)
    trim()
    write_members('ZREM', ids, gone)
    provider_counted, merchant_counted = holds(gone, provider_marker()), holds(gone, merchant_marker())
    algo.give_back(prev, n)
    reset_memo = nil
    algo.save()
    flush()
    return n
  end
  prepare()
  local r = reserve()
  finish()
  return r
end

-- decide is one call: its keys and arguments in, its reply out.
local function decide(keys, argv)
  local err = begin(keys, argv, argv[1], argv[5], argv[8], #argv == 8) or begin_job(argv[2], argv[3], argv[4], argv[6], argv[7]) or start()
  if err then return err end
  algo.init()
  return run()
end

-- batch decides several reserves of one provider in one call (see the header, op 'batch'): the state is
-- read once, then each job is decided as its own call would be, one after another, each seeing what the
-- ones before it did; the writes of all are applied together at the end.
local function batch(keys, argv)
  local n = tonumber(argv[2])
  if not whole(n) or n < 1 or n > 1000 or #argv ~= 4 + 5 * n then
    return bad('batch: want 1..1000 jobs of 5 arguments between the count and stale, settings; count', argv[2])
  end
  local err = begin(keys, argv, 'reserve', argv[#argv - 1], argv[#argv], true)
  if err then return err end
  if M > 0 then return bad('batch: merchant policies go alone; merchant policies', M) end
  local out, names, asked, started = {}, {}, {}, false
  for i = 1, n do names[i] = argv[2 + (i - 1) * 5 + 1] end
  C.out, C.nout = out, 1 -- out[1]: now, once a job is decided
  for i = 1, n do
    local b = 2 + (i - 1) * 5
    local e = begin_job(argv[b + 1], argv[b + 2], argv[b + 3], argv[b + 4], argv[b + 5])
    if not e and asked[id] then
      -- Each job is decided against the state as the call read it (lookup): a job id comes once a call.
      e = bad('batch: a job id at most once a call; repeated', id)
    end
    if e then
      C.nout = C.nout + 1
      out[C.nout] = e
    else
      asked[id] = true
      if not started then
        -- The call's reads, at its first good job (a batch of bad jobs reads and writes nothing, as each
        -- alone would): the state, and every job's slot in the record in one read.
        err = start()
        if err then return err end
        started = true
        algo.init()
        algo.load(true)
        prepare()
        C.got = redis.call('ZMSCORE', ids, unpack(names))
      end
      C.job = i
      local k = C.nout
      reserve() -- its reply goes into out
      -- Every way out of reserve replies once: a job without its 6 numbers would shift every later one
      if C.nout ~= k + 6 then error('paygate: batch job ' .. i .. ' left ' .. (C.nout - k) .. ' numbers') end
    end
  end
  if started then finish() end
  out[1] = started and now or 0
  return out
end

-- paygate is the entry point. gate.go appends the line that runs it: `return paygate(eval_args())` under
-- EVALSHA, or registers it as the library's function.
local function paygate(keys, argv)
  if not math then bind_globals() end
  if argv[1] == 'batch' then return batch(keys, argv) end
  return decide(keys, argv)
end

-- serving returns an entry point for the ops named only: the library registers one function per set of
-- flags (gate.go's family): paygate_release (allow-oom: a release only gives back, a departure only moves
-- what was sent; a postponement lets a request go, and runs as a reserve does) and paygate_ro (no-writes:
-- status and merchants read).
local function serving(ops)
  return function(keys, argv)
    if not math then bind_globals() end
    if not ops[argv[1]] then return bad('this function does not serve op', argv[1]) end
    return paygate(keys, argv)
  end
end
local paygate_release = serving({release = true, depart = true})
local paygate_ro = serving({status = true, merchants = true})
