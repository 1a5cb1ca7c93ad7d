-- ARGV: prefix, limit. The running jobs whose lease ran out (expiry before now): per job
-- id, token, attempts, max, owner, started (1/0). Read only: the rescuer decides, then RESCUE writes.
local now = now_ms()
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[2]))) do
  local f = redis.call('HMGET', jkey(id), 'token', 'attempts', 'max', 'owner', 'started', 'status')
  if f[6] == 'running' then
    out[#out + 1] = {id, tonumber(f[1]), tonumber(f[2]), tonumber(f[3]), f[4] or '', f[5] and 1 or 0}
  end
end
return out
