-- ARGV: prefix, id, token, the signal's name, the step's name, the step's body without its value
-- (status NUL started NUL ended NUL: see put_step). Fenced as an outcome: 0 if the job is not
-- running under that token (nothing changed). Else the oldest signal of that name the job has not
-- consumed is consumed, and the step written with its payload as the value: '+' then the payload
-- ('v' then its JSON text, or nothing for none); 1 if there is none (nothing written).
local id, name = ARGV[2], ARGV[4]
local f = redis.call('HMGET', jkey(id), 'status', 'token')
if f[1] ~= 'running' or f[2] ~= ARGV[3] then return 0 end
local i = signal_kept(id, name)
if not i then return 1 end
local sk = P .. 'sig:' .. id
local entry = 'e:' .. i .. ':' .. name
local payload = redis.call('HGET', sk, entry) or ''
redis.call('HDEL', sk, entry)
redis.call('HSET', sk, 'h:' .. name, i)
put_step(id, ARGV[5], ARGV[6] .. payload)
return '+' .. payload
