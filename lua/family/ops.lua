-- family/ops.lua: the operations (see contract.lua for each one's arguments and reply). A reserve is three
-- steps: prepare reads what it needs beside the algorithm's state, reserve decides the job, finish applies
-- the call's writes; a batch runs reserve once per job between one prepare and one finish. Then run, which
-- runs one call's op (merchants, status, depart and postpone, release, reserve); decide (one call) and
-- batch; and the entry points.

-- A reserve's replies. deny drops the writes the job queued (since `kept`, set as it begins): the call's
-- own (the trim, a warm-up, the lapsed leases' removal) and the jobs' before it stay.
local function deny(r)
  drop_writes(kept)
  return r
end
-- reply appends the job's 6 numbers (see the header: its flags and policy in one) to the call's reply
-- (C.out, of C.nout values so far: a single reserve's is a batch of one's) and returns it.
local function reply(allowed, dup, delay, retry, room, index, paused, admitted, moved, in_flight, leased, cancel)
  local reset = math.ceil(reset_after())
  if reset < 0 then reset = 0 end
  in_flight, leased, cancel = in_flight or 0, leased or 0, cancel or 0
  local r, k = C.out, C.nout
  r[k + 1] = allowed + 2 * dup + 4 * paused + 8 * moved + 16 * in_flight + 32 * leased + 128 * cancel + 256 * (index - 1)
  r[k + 2], r[k + 3], r[k + 4], r[k + 5], r[k + 6] = delay, retry, room, admitted, reset
  C.nout = k + 6
  return r
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
    -- "<provider> <until_us> <lost_us>": a gate.Announcement of kind AnnounceLoss (gate/announce.go).
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
  if cancelled() then
    -- Cancelled (`worker cancel`): never admitted, whatever the budget; nothing changes.
    local room, index = algo.room(now)
    return deny(reply(0, 0, 0, 0, room, index, 0, 0, 0, 0, 0, 1))
  end
  local prev, marked = lookup()
  local max_wait, pause_until, tat = arg4, C.pause_until, C.tat
  if pause_until > now and tonumber(redis.call('ZSCORE', marks, id .. '\0p') or 0) >= pause_until then
    pause_until = 0 -- the breaker's probe (breaker.lua): the pause is the hold it was granted under
  end
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

-- run runs the op begin set, once begin_job and start have. One function rather than one per op: under
-- EVALSHA every function of the chunk is made anew on each call.
local function run()
  if M > 0 and not algo.merchants then return bad('merchant limits are not counted by this algorithm; merchant policies', M) end
  if op == 'merchants' then -- how many merchants were seen, and the newest arg4 of them
    local since = '(' .. int(now - seen_for)
    local reply = {now, redis.call('ZCOUNT', merchants, since, '+inf')}
    if arg4 > 0 then
      local got = redis.call('ZREVRANGEBYSCORE', merchants, '+inf', since, 'WITHSCORES', 'LIMIT', 0, arg4)
      for j = 1, #got, 2 do reply[#reply + 1], reply[#reply + 2] = got[j], tonumber(got[j + 1]) end
    end
    return reply
  end
  if op == 'status' then -- the provider's state; nothing written
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
    -- The id's units, admitted at the slot arg4, move to when the request left (depart: the slot plus
    -- late, at most now) or to now (postpone: about to leave), with its lease.
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
  if op == 'release' then -- the id's entry given back: never a duplicate's or a sent job's (marked)
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
  C.out, C.nout = {now}, 1 -- a batch of one's reply
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
        local cancels = {}
        for j = 1, n do cancels[j] = cancel_mark(names[j]) end
        C.cancels = redis.call('ZMSCORE', marks, unpack(cancels))
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

-- paygate is the entry point (declared in contract.lua). The gate appends the line that runs it: `return
-- paygate(eval_args())` under EVALSHA, or registers it as the library's function.
function paygate(keys, argv)
  if not math then bind_globals() end
  if argv[1] == 'batch' then return batch(keys, argv) end
  return decide(keys, argv)
end

-- serving returns an entry point for the ops named only: the library registers one function per set of
-- flags (gate/algorithm.go's family): paygate_release (allow-oom: a release only gives back, a departure only moves
-- what was sent; a postponement lets a request go, and runs as a reserve does) and paygate_ro (no-writes:
-- status and merchants read).
local function serving(ops)
  return function(keys, argv)
    if not math then bind_globals() end
    if not ops[argv[1]] then return bad('this function does not serve op', argv[1]) end
    return paygate(keys, argv)
  end
end
paygate_release = serving({release = true, depart = true})
paygate_ro = serving({status = true, merchants = true})
