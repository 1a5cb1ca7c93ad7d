-- ARGV: prefix, index key, offset, limit, priority ('' for any), order (newest / claim). The
-- total of the index and one page of it, newest id first, each job's RECORD_FIELDS after its
-- id: one snapshot, so the page and total agree. With a priority or in claim order, the page is
-- chosen from every job of the index, read here (no index orders jobs of every status by
-- priority): O(jobs of the index), where newest first reads only the page.
local key, offset, limit, prio, order = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], ARGV[6]
local page
local out
if prio == '' and order == 'newest' then
  out = {redis.call('ZCARD', key)}
  page = redis.call('ZRANGE', key, '+', '-', 'BYLEX', 'REV', 'LIMIT', offset, limit)
else
  local picked = {}
  for _, id in ipairs(redis.call('ZRANGE', key, 0, -1)) do  -- by id, oldest first
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
