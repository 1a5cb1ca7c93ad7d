-- ARGV: prefix, older_than_ms, limit, status (completed / dead / cancelled), look (entries to look at
-- most). Retention's delete (retention.py), as cleanup.lua's for one status, but a job of a batch whose
-- callback has not finished yet stays: the callback reads every job of its batch (ctx.batch()). Those
-- kept are passed over (the next range starts after them), so up to ``look`` entries are looked at for
-- the ``limit`` deleted; each batch's callback is read once per call.
local older, limit, s, look = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local key = P .. 'done:' .. s
local before = '(' .. (now_ms() - older)
local held = {} -- batch id -> its callback is still to finish
local function kept(batch)
  local v = held[batch]
  if v == nil then
    local cb = redis.call('HGET', P .. 'batch:' .. batch, 'cb')
    local status = cb and cb ~= '' and redis.call('HGET', jkey(cb), 'status')
    v = status and not is_final(status) or false
    held[batch] = v
  end
  return v
end
local n, passed, looked = 0, 0, 0
while n < limit and looked < look do
  local ids = redis.call('ZRANGEBYSCORE', key, '-inf', before, 'LIMIT', passed, math.min(limit - n, look - looked))
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    looked = looked + 1
    local f = redis.call('HMGET', jkey(id), 'status', 'type', 'prio', 'wfor', 'kids', 'batch')
    if f[1] ~= s then -- not a job of this status any more (should not happen): drop the stray entry
      redis.call('ZREM', key, id)
      n = n + 1
    elseif f[6] and kept(f[6]) then
      passed = passed + 1
    else
      remove_job(id, s, f[2], f[3], nil, nil, nil, nil, f[4], f[5], f[6])
      n = n + 1
    end
  end
end
publish_woken()
return n
