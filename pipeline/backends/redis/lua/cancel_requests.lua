-- ARGV: prefix, owner. The running jobs ``owner`` holds whose cancel was requested: id, token,
-- id, token... (creq:<owner>, kept by CANCEL and by every script by which a job leaves running;
-- an entry that no longer matches its job, which none of them leaves, is dropped). Made twice a
-- second by every process that holds running jobs: one SMEMBERS of a missing key when none.
local idx = P .. 'creq:' .. ARGV[2]
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', idx)) do
  local f = redis.call('HMGET', jkey(id), 'status', 'owner', 'creq', 'token')
  if f[1] == 'running' and f[2] == ARGV[2] and f[3] then
    out[#out + 1] = id
    out[#out + 1] = f[4]
  else
    redis.call('SREM', idx, id)
  end
end
return out
