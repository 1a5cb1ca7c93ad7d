-- ARGV: prefix, owner, types (JSON), lease_ms, n, then id, token per lease. Records the worker
-- as alive; pushes the expiry of the leases still held; returns the ids of the others.
local owner, lease, n = ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
redis.call('HSET', P .. 'workers', owner, now .. '|' .. lease .. '|' .. ARGV[3])
local lost = {}
for i = 0, n - 1 do
  local id, token = ARGV[6 + i * 2], ARGV[7 + i * 2]
  local key = jkey(id)
  local f = redis.call('HMGET', key, 'status', 'token')
  if f[1] == 'running' and f[2] == token then
    redis.call('HSET', key, 'expires', now + lease)
    redis.call('ZADD', P .. 'leases', now + lease, id)
  else
    lost[#lost + 1] = id
  end
end
return lost
