-- ARGV: prefix, limit. Up to ``limit`` suspended jobs whose time came (the suspended set, by when
-- they are due: a range of it, so that its cost is the jobs it wakes, not the jobs that wait) go
-- pending (RESUME), due at their own time, oldest due first; PUBLISH wake if any did. Returns how
-- many, and the ms until the next suspended job is due (0: more are due now; -1: none has a deadline).
local now = now_ms()
local set = P .. 'suspended'
local n = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', set, '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))) do
  local key = jkey(id)
  local f = redis.call('HMGET', key, 'status', 'run')
  if f[1] == 'suspended' then
    resume(id, key, tonumber(f[2]), now)
    n = n + 1
  else  -- (a stray entry: its job left suspended without leaving the set; should not happen)
    redis.call('ZREM', set, id)
  end
end
if n > 0 then redis.call('PUBLISH', P .. 'wake', '1') end
local head = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
if not head[2] or tonumber(head[2]) >= FOREVER_MS then return {n, -1} end
return {n, math.max(tonumber(head[2]) - now, 0)}
