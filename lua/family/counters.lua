-- family/counters.lua: for the algorithms that keep counters named by window (sliding_window,
-- fixed_window; appended only to theirs): read a counter hash, find a counter, give a job's units back.

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
