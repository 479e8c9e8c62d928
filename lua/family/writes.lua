-- family/writes.lua: the write queue (see contract.lua: "A decision that fails writes nothing"). A call
-- never writes to Redis while it decides: write() and its kin queue each command, drop_writes forgets what
-- a denial queued, and flush applies the queue once nothing can fail any more.
--
-- The queue is flat: the commands' arguments one after another in wq (wq[1..wtop]), write k's from
-- wq[ws[k]], nwrites of them. One array rather than a table per write, and kept between a function's calls
-- (start_writes empties it by its counts), because making tables on every write costs every decision
-- time. inject_at is for tests only: gate's TestFailedDecisionWritesNothing rewrites its line to raise an
-- error at the n-th write queued, and checks that nothing was written.
local inject_at = 0
local wq, ws, wtop, nwrites = {}, {}, 0, 0
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
-- write_members queues cmd key then members (for ZADD a score before each), split into calls of at most
-- 2000 arguments after the key (Lua's unpack takes at most 8000 values).
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
-- flush applies the queue, in order.
local function flush()
  ws[nwrites + 1] = wtop + 1
  for k = 1, nwrites do redis.call(unpack(wq, ws[k], ws[k + 1] - 1)) end
  return true
end

-- int formats a whole number as Redis parses an integer (see contract.lua: "Numbers Redis parses").
local function int(x) return string.format('%d', x) end
-- num formats a number exactly, as %.17g does: a whole one below 1e17 (but -0) as int does, which prints
-- the same digits at a third of the cost; others with 17 significant digits.
local function num(x)
  if x % 1 == 0 and x > -1e17 and x < 1e17 and (x ~= 0 or 1 / x > 0) then return string.format('%d', x) end
  return string.format('%.17g', x)
end
-- expire queues key's expiry, ms from now (rounded up).
local function expire(key, ms) write('PEXPIRE', key, int(math.ceil(ms))) end
