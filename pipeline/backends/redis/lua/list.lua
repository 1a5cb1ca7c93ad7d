-- ARGV: prefix, index key, offset, limit, priority ('' for any), order (newest / claim). The
-- total of the index and one page of it, newest id first, each job's RECORD_FIELDS after its
-- id: one snapshot, so the page and total agree. With a priority or in claim order, the page is
-- chosen from every job of the index, read here (no index orders jobs of every status by
-- priority): O(jobs of the index), where newest first reads only the page.
-- ARGV[7], when given, is a status of the prelude's HOT (no status:<s> set, layout 7): the index is
-- then the union of st:<s>:<t> over every type (the one given is not read), its newest page merged
-- from the newest offset + limit ids of each.
local key, offset, limit, prio, order = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], ARGV[6]
local keys = {key}
if ARGV[7] then
  keys = {}
  for _, t in ipairs(redis.call('SMEMBERS', P .. 'types')) do keys[#keys + 1] = P .. 'st:' .. ARGV[7] .. ':' .. t end
end
local function newest_first(a, b) return a > b end
local page
local out
if prio == '' and order == 'newest' and #keys == 1 then
  key = keys[1]
  out = {redis.call('ZCARD', key)}
  page = redis.call('ZRANGE', key, '+', '-', 'BYLEX', 'REV', 'LIMIT', offset, limit)
elseif prio == '' and order == 'newest' then
  local total, ids = 0, {}
  for _, k in ipairs(keys) do
    total = total + redis.call('ZCARD', k)
    for _, id in ipairs(redis.call('ZRANGE', k, '+', '-', 'BYLEX', 'REV', 'LIMIT', 0, offset + limit)) do
      ids[#ids + 1] = id
    end
  end
  table.sort(ids, newest_first)
  out = {total}
  page = {}
  for i = offset + 1, math.min(offset + limit, #ids) do page[#page + 1] = ids[i] end
else
  local all = {}
  for _, k in ipairs(keys) do
    for _, id in ipairs(redis.call('ZRANGE', k, 0, -1)) do all[#all + 1] = id end
  end
  if #keys > 1 then table.sort(all) end
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
