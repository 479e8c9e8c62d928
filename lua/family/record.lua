-- family/record.lua: what the driver keeps in the provider's keys beside the algorithm's state: the id
-- record (KEYS[1]), its marks (KEYS[3]), the in-flight leases (KEYS[#KEYS-2]) and the epoch (KEYS[#KEYS]);
-- and the expiries of the call's keys.

-- keep_until keeps key at least until the instant until_us and a second (its expiry is only extended).
local function keep_until(key, until_us)
  local ttl = math.ceil((until_us - now) / 1000) + 1000
  if redis.call('PTTL', key) < ttl then write('PEXPIRE', key, int(ttl)) end
end

-- extend asks finish to keep key at least ttl_ms from now (one PTTL and at most one PEXPIRE per key and
-- call, whatever the number of jobs that asked).
local function extend(key, ttl_ms)
  if ttl_ms > (C.ttl[key] or 0) then C.ttl[key] = ttl_ms end
end

-- The id record.

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
-- mark in KEYS[3] ('s': sent, 'd': a duplicate let go; false: none). A batch's ids are distinct, so no
-- earlier job of the call changed either. Marks matter only to an id in the record (a mark left from an
-- earlier life of an id that has left the record since is harmless: it can only refuse a release, which
-- keeps a unit spent, never too few).
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

-- cancelled tells whether the job was cancelled (cancel.lua): its mark base.."\0c" in KEYS[3] stands, where
-- base is the job's own id, the gate id before a retry's "\31<attempt>" (gate.GateID), so that a cancel
-- reaches every attempt. A batch reads its jobs' marks in one ZMSCORE (C.cancels); a key with no such
-- mark costs one lookup of a missing member.
local function cancel_mark(gate_id) return string.match(gate_id, '^[^\31]*') .. '\0c' end
local function cancelled()
  local got
  if C.cancels then got = C.cancels[C.job] else got = redis.call('ZSCORE', marks, cancel_mark(id)) end
  got = tonumber(got or nil)
  return got ~= nil and got >= now
end

-- The marks.

-- mark queues a mark on the id (kind 's': sent, 'd': a duplicate let go), kept for ttl_us: at least as
-- long as the record keeps the id. The marks whose time is past go with it: the set holds only what the
-- record may still ask about.
local function mark(kind, ttl_us)
  write('ZADD', marks, int(now + ttl_us), id .. '\0' .. kind)
  write('ZREMRANGEBYSCORE', marks, '-inf', '(' .. int(now))
  extend(marks, math.ceil(ttl_us / 1000) + 1000)
end

-- The in-flight leases.

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

-- The epoch.

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
