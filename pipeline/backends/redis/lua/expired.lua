-- ARGV: prefix, limit. First ends cancelled every pending job whose expires_at passed, of any
-- type (expire_due: the jobs nobody claims; etypes names the types that have any). Then reads
-- the running jobs whose lease ran out (expiry before now): per job id, token, attempts, max,
-- owner, started (1/0); the rescuer decides, then RESCUE writes. Returns the expired count first.
local now = now_ms()
local out = {0}
for _, t in ipairs(redis.call('SMEMBERS', P .. 'etypes')) do out[1] = out[1] + expire_due(t, now) end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[2]))) do
  local f = redis.call('HMGET', jkey(id), 'token', 'attempts', 'max', 'owner', 'started', 'status')
  if f[6] == 'running' then
    out[#out + 1] = {id, tonumber(f[1]), tonumber(f[2]), tonumber(f[3]), f[4] or '', f[5] and 1 or 0}
  end
end
publish_woken()
return out
