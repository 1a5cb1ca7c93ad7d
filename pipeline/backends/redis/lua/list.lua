-- ARGV: prefix, index key, offset, limit, priority ('' for any), order (newest / claim). The
-- total of the index and one page of it, newest id first, each job's RECORD_FIELDS after its
-- id: one snapshot, so the page and total agree. With a priority or in claim order, the page is
-- chosen from every job of the index, read here (no index orders jobs of every status by
-- priority): O(jobs of the index), where newest first reads only the page.
-- ARGV[7], when given, is the status of the index; one of the prelude's HOT (no status:<s> set, layout
-- 7) makes the index the union of st:<s>:<t> over every type that has jobs of it (the key given is not read).
-- Newest first across several types, the page starts at the id with ``offset`` ids above it, found
-- by a binary search in each type's set (its ids by rank; ZLEXCOUNT of each set counts the ids above
-- a candidate): O(types² · log² n) commands, whatever the offset, as a bulk action pages deep; then
-- the next ``limit`` ids of each type from there, merged.
local key, offset, limit, prio, order = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], ARGV[6]
local keys = {key}
local sizes = {}
if ARGV[7] and HOT[ARGV[7]] then
  keys = {}
  for _, t in ipairs(redis.call('SMEMBERS', P .. 'types')) do
    local k = P .. 'st:' .. ARGV[7] .. ':' .. t
    local n = redis.call('ZCARD', k)
    if n > 0 then keys[#keys + 1] = k; sizes[#keys] = n end
  end
end
local function newest_first(a, b) return a > b end
local function above(id)  -- how many ids of the keys sort after id
  local n = 0
  for _, k in ipairs(keys) do n = n + redis.call('ZLEXCOUNT', k, '(' .. id, '+') end
  return n
end
local function nth_newest()  -- the id with exactly ``offset`` ids above it, or nil (offset >= total)
  for i, k in ipairs(keys) do
    local lo, hi = 0, sizes[i] - 1
    while lo <= hi do
      local mid = math.floor((lo + hi) / 2)
      local id = redis.call('ZRANGE', k, mid, mid, 'REV')[1]
      local n = above(id)
      if n == offset then return id elseif n < offset then lo = mid + 1 else hi = mid - 1 end
    end
  end
  return nil
end
local page
local out
if prio == '' and order == 'newest' and #keys == 1 then
  key = keys[1]
  out = {redis.call('ZCARD', key)}
  page = redis.call('ZRANGE', key, '+', '-', 'BYLEX', 'REV', 'LIMIT', offset, limit)
elseif prio == '' and order == 'newest' then
  local total = 0
  for i = 1, #keys do total = total + sizes[i] end
  out = {total}
  page = {}
  local first = offset < total and limit > 0 and nth_newest() or nil
  if first then
    local ids = {}
    for _, k in ipairs(keys) do
      for _, id in ipairs(redis.call('ZRANGE', k, '[' .. first, '-', 'BYLEX', 'REV', 'LIMIT', 0, limit)) do
        ids[#ids + 1] = id
      end
    end
    table.sort(ids, newest_first)
    for i = 1, math.min(limit, #ids) do page[i] = ids[i] end
  end
else
  local all = #keys == 1 and redis.call('ZRANGE', keys[1], 0, -1) or {}
  if #keys > 1 then
    for _, k in ipairs(keys) do
      for _, id in ipairs(redis.call('ZRANGE', k, 0, -1)) do all[#all + 1] = id end
    end
    table.sort(all)
  end
  local picked = {}
  for _, id in ipairs(all) do  -- by id, oldest first
    local f = redis.call('HMGET', jkey(id), 'prio', 'run')
    if prio == '' or f[1] == prio then picked[#picked + 1] = {id, tonumber(f[1]), tonumber(f[2])} end
  end
  if order == 'claim' then
    table.sort(picked, function(a, b)
      if a[2] ~= b[2] then return a[2] < b[2] end
      if a[3] ~= b[3] then return a[3] < b[3] end
      return a[1] < b[1]
    end)
  else
    local n = #picked
    for i = 1, math.floor(n / 2) do picked[i], picked[n + 1 - i] = picked[n + 1 - i], picked[i] end
  end
  out = {#picked}
  page = {}
  for i = offset + 1, math.min(offset + limit, #picked) do page[#page + 1] = picked[i][1] end
end
for _, id in ipairs(page) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HMGET', jkey(id), 'type', 'payload', 'status', 'attempts', 'max', 'run', 'error',
                             'created', 'updated', 'prio', 'owner', 'expires', 'ukey', 'result', 'progress', 'pmsg',
                             'snoozes', 'expat', 'creq', 'lkey', 'wfor', 'opf', 'batch', 'await')
end
return out
