-- family/undo.lua: the undoable state of token_bucket, gcra and leaky_bucket (appended only to theirs).
--
-- store is that state: one hash of numbers (v:<name>, for the given names) and the undo record of the
-- newest admission (last = its id, last_slot, u:<name> = the numbers before it), so that a release or move
-- of that admission restores exactly what it changed. An older admission cannot be undone soundly: later
-- ones were decided on top of it. A call has one store: its functions are made once, undoable() sets its
-- fields for the call. Its fields:
--   key, names  the hash and the names of its numbers: a table kept in the settings' table (conf), where
--               undoable builds the field names once per settings (vf: v:*, uf: u:*, vfields: what load's
--               one HMGET reads)
--   v, u        the numbers (by name) as they are, and as they were before the newest admission (nil:
--               none, a full bucket)
--   last, last_slot  the newest admission's id ('' none) and slot
--   dirty       the call changed them: save writes them
--   fresh       v is as load read it, unchanged
--   as_read     u is a copy of v as read (begin's at a fresh state): save writes u:* with the strings
--               load read (read_strings) instead of formatting the numbers anew; num's string for the
--               number a string of num's reads back as is that string
--   u_known     u holds the undo record's numbers (as read, or as the call set them)
-- vbuf and ubuf are the tables v and u start a call with: they live on between a function's calls
-- (undoable empties them) and begin copies into u in place, because making two tables on every call
-- costs every decision time.
local store = {}
local vbuf, ubuf, read_strings = {}, {}, {}
-- copy_into sets to[name] = from[name] for every name, and returns to.
local function copy_into(to, from)
  local names = store.names
  for j = 1, #names do
    local name = names[j]
    to[name] = from[name]
  end
  return to
end
-- load reads last, last_slot and v:* only: the undo record's numbers (u:*) matter to give_back alone (an
-- admission's begin replaces them first), which reads them then (store.u_known: store.u holds them, as
-- read or as this call set them). Until a write of the call's is applied, Redis holds them as the call
-- began.
function store.load()
  local got = redis.call('HMGET', store.key, unpack(store.names.vfields))
  store.last, store.last_slot = got[1] or '', tonumber(got[2] or 0)
  local names, v = store.names, store.v
  for j = 1, #names do
    local name, s = names[j], got[2 + j] or nil
    v[name], read_strings[name] = tonumber(s), s
  end
  store.fresh, store.u_known = true, false
end
-- begin records the numbers as they are before an admission at slot (which changes store.v next).
function store.begin(slot)
  copy_into(store.u, store.v)
  store.last, store.last_slot, store.dirty, store.as_read, store.fresh, store.u_known =
    id, slot, true, store.fresh, false, true
end
-- give_back restores the numbers before the newest admission when it is the job's at slot: a token for
-- take_back, or nil (not the newest: nothing changes).
function store.give_back(slot)
  if store.last ~= id or store.last_slot ~= slot then return nil end
  if not store.u_known then
    local got, names, u = redis.call('HMGET', store.key, unpack(store.names.uf)), store.names, store.u
    for j = 1, #names do u[names[j]] = tonumber(got[j] or nil) end
    store.u_known = true
  end
  local token = {v = store.v, u = store.u, last = store.last, last_slot = store.last_slot, as_read = store.as_read,
    fresh = store.fresh}
  store.v, store.u, store.last, store.last_slot, store.dirty, store.as_read, store.fresh =
    copy_into({}, store.u), {}, '', 0, true, false, false
  return token
end
-- take_back undoes give_back (a move denied afresh).
function store.take_back(token)
  if token then
    store.v, store.u, store.last, store.last_slot, store.as_read, store.fresh =
      token.v, token.u, token.last, token.last_slot, token.as_read, token.fresh
  end
end
-- save writes every field (last = '' means no undo; u:* are then ignored), and deletes the numbers that
-- are no more: undoing the first admission after an idle spell restores "no state", a full bucket. Both
-- are built in the write queue itself.
function store.save(ttl_ms)
  if not store.dirty then return end
  local names, v, u = store.names, store.v, store.u
  local vf, uf, n = names.vf, names.uf, #names
  local gone = false
  for j = 1, n do
    local name = names[j]
    if not v[name] or not u[name] then gone = true end
  end
  if gone then
    open_write('HDEL', store.key)
    local t = wtop
    for j = 1, n do
      local name = names[j]
      if not v[name] then wq[t + 1], t = vf[j], t + 1 end
      if not u[name] then wq[t + 1], t = uf[j], t + 1 end
    end
    wtop = t
  end
  open_write('HSET', store.key)
  local t = wtop
  wq[t + 1], wq[t + 2], wq[t + 3], wq[t + 4], t = 'last', store.last, 'last_slot', int(store.last_slot), t + 4
  local as_read = store.as_read
  for j = 1, n do
    local name = names[j]
    local x, y = v[name], u[name]
    if x then wq[t + 1], wq[t + 2], t = vf[j], num(x), t + 2 end
    if y then
      if as_read then y = read_strings[name] else y = num(y) end
      wq[t + 1], wq[t + 2], t = uf[j], y, t + 2
    end
  end
  wtop = t
  expire(store.key, ttl_ms)
end
-- undoable readies store for the call, over the hash key and the numbers names (see store's fields), and
-- returns it.
local function undoable(key, names)
  if not names.vfields then
    local vf, uf, vfields = {}, {}, {'last', 'last_slot'}
    for j, name in ipairs(names) do
      vf[j], uf[j] = 'v:' .. name, 'u:' .. name
      vfields[j + 2] = vf[j]
    end
    names.vf, names.uf, names.vfields = vf, uf, vfields
  end
  if store.names ~= names then vbuf, ubuf, read_strings = {}, {}, {} end -- other names: none of the last call's stays
  store.key, store.names, store.v, store.u, store.last, store.last_slot, store.dirty, store.as_read, store.fresh =
    key, names, vbuf, ubuf, '', 0, false, false, false
  for j = 1, #names do
    local name = names[j]
    vbuf[name], ubuf[name], read_strings[name] = nil, nil, nil
  end
  return store
end
