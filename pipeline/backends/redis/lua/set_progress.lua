-- ARGV: prefix, id, token, fraction, has_message (1/0), message. Fenced like an outcome: written
-- only while the job runs under ``token``. Returns 1 if written, else 0.
local key = jkey(ARGV[2])
local f = redis.call('HMGET', key, 'status', 'token')
if f[1] ~= 'running' or f[2] ~= ARGV[3] then return 0 end
if ARGV[5] == '1' then
  redis.call('HSET', key, 'progress', ARGV[4], 'pmsg', ARGV[6])
else
  redis.call('HSET', key, 'progress', ARGV[4])
  redis.call('HDEL', key, 'pmsg')
end
return 1
