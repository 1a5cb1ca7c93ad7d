-- ARGV: prefix, older_than_ms ('' for any age), limit, then statuses (completed / dead / cancelled).
-- Deletes up to ``limit`` finished jobs (the caller calls again while it gets ``limit``):
-- one long script would stop every other client meanwhile. Their workflow keys go with them (remove_job).
local older, limit = ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local n = 0
for i = 4, #ARGV do
  local s = ARGV[i]
  if n >= limit then break end
  local ids
  if older == '' then
    ids = redis.call('ZRANGE', P .. 'done:' .. s, 0, limit - n - 1)
  else
    ids = redis.call('ZRANGEBYSCORE', P .. 'done:' .. s, '-inf', '(' .. (now - tonumber(older)), 'LIMIT', 0, limit - n)
  end
  for _, id in ipairs(ids) do
    local f = redis.call('HMGET', jkey(id), 'status', 'type', 'prio', 'wfor', 'kids', 'batch')
    if f[1] == s then
      remove_job(id, s, f[2], f[3], nil, nil, nil, nil, f[4], f[5], f[6])
    else -- not a job of this status any more (should not happen): drop the stray entry
      redis.call('ZREM', P .. 'done:' .. s, id)
    end
    n = n + 1
  end
end
publish_woken()
return n
