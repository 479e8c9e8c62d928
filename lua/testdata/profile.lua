-- profile.lua: one family script's reserves in plain Lua 5.1, Redis stubbed, counting what its own Lua does
-- (package lua's TestLuaProfile runs it: PAYGATE_LUA_PROFILE=1 go test -run TestLuaProfile -v ./lua/).
--
--   lua5.1 profile.lua SCRIPT [JOBS]
--
-- SCRIPT is an algorithm's script as the gate runs it (lua.SlidingLog, ...); JOBS: 0 (default) one reserve
-- a call, else op batch with that many jobs a call. Redis answers as a provider with room would: nothing
-- paused, paced, cancelled or recorded, a count of 1000, a queue's tail just before now; writes succeed.
-- It prints the VM instructions and the calls of C functions per job, and per job the instructions of the
-- functions that take most (each function's own, not those it calls). Counts, not times: they are the
-- same on every machine, and a change that takes instructions out of the script shows here exactly.
local path, jobs = arg[1], tonumber(arg[2] or '0')
local pairs, print, string, table, math, tostring, select, io, debug =
  pairs, print, string, table, math, tostring, select, io, debug

local clock_us = 1795814550503727
redis = {
  call = function(cmd, ...)
    if cmd == 'TIME' then
      clock_us = clock_us + 10
      return {tostring(math.floor(clock_us / 1e6)), tostring(clock_us % 1e6)}
    end
    if cmd == 'ZREVRANGE' then return {'x', tostring(clock_us - 100)} end
    if cmd == 'ZMSCORE' or cmd == 'HMGET' then
      local t = {}
      for i = 1, select('#', ...) - 1 do t[i] = false end
      return t
    end
    if cmd == 'MGET' then return {false, false, false} end
    if cmd == 'HGETALL' or cmd == 'ZRANGEBYSCORE' or cmd == 'ZRANGE' then return {} end
    if cmd == 'ZCOUNT' then return 1000 end
    if cmd == 'PTTL' then return 100000 end
    if cmd == 'HGET' or cmd == 'GET' or cmd == 'ZSCORE' then return false end
    return 'OK'
  end,
  pcall = function(...) return redis.call(...) end,
  error_reply = function(s) return {err = s} end,
  sha1hex = function() return string.rep('a', 40) end,
}

local src = assert(io.open(path)):read('*a')
local paygate = assert(loadstring(src .. '\nreturn paygate', 'script'))()
local keys = {'p{p}:log', 'p{p}:pause', 'p{p}:marks', 'p{p}:merchants', 'p{p}:limits', 'p{p}:flight', 'p{p}:pace', 'p{p}:epoch'}
-- margin 10ms, dedup 60.01s, one policy of 20000 a minute: the bench's (bench/cost.go)
local settings = '10000 60010000 0 0 0 0 0 0 0 1 0 20000 60000000'
local function call(i)
  if jobs == 0 then return paygate(keys, {'reserve', 'job-' .. i, '1', '5000000', '5000', '0', '', settings}) end
  local argv = {'batch', tostring(jobs)}
  for j = 1, jobs do
    for _, v in ipairs({'job-' .. i .. '-' .. j, '1', '5000000', '0', ''}) do argv[#argv + 1] = v end
  end
  argv[#argv + 1], argv[#argv + 2] = '5000', settings
  return paygate(keys, argv)
end
for i = 1, 20 do -- warm: the settings parsed, the tables made
  local r = call(i)
  if type(r) == 'table' and r.err then error(r.err) end
end

local calls, own, total, cfuncs = 20, {}, 0, 0
debug.sethook(function(event)
  local info = debug.getinfo(2, 'S')
  if not info then return end
  if event == 'call' then -- a C function the script calls (the stub's redis.call is Lua: not counted)
    local caller = debug.getinfo(3, 'S')
    if info.what == 'C' and caller and caller.source == 'script' then cfuncs = cfuncs + 1 end
    return
  end
  if info.source ~= 'script' then return end
  if event == 'count' then
    own[info.linedefined] = (own[info.linedefined] or 0) + 1
    total = total + 1
  end
end, 'c', 1)
for i = 100, 99 + calls do call(i) end
debug.sethook()

local per = calls * math.max(jobs, 1)
local lines = {}
for l in string.gmatch(src, '([^\n]*)\n?') do lines[#lines + 1] = l end
local ranked = {}
for line, n in pairs(own) do ranked[#ranked + 1] = {line, n} end
table.sort(ranked, function(a, b) return a[2] > b[2] end)
print(string.format('%.0f VM instructions and %.1f calls of C functions a job', total / per, cfuncs / per))
for k = 1, math.min(15, #ranked) do
  local line, n = ranked[k][1], ranked[k][2]
  print(string.format('%6.0f  %s', n / per, string.match(lines[line] or '?', '^%s*(.-)%s*$')))
end
