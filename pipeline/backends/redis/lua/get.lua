-- ARGV: prefix, id, how many relatives to list, then the fields to read (scripts.RECORD_FIELDS).
-- One snapshot: the fields, then the job's parents in ``after`` order (the first ``listed``), how
-- many it has, its children oldest first (the first ``listed``), how many it has, its steps (HGETALL
-- of steps:<id>: name, then "<place> <body>", see put_step). Nil if unknown.
local id, listed = ARGV[2], tonumber(ARGV[3])
if redis.call('EXISTS', jkey(id)) == 0 then return nil end
local fields = redis.call('HMGET', jkey(id), unpack(ARGV, 4))
local ak, ck = P .. 'after:' .. id, P .. 'children:' .. id
return {fields, redis.call('ZRANGE', ak, 0, listed - 1), redis.call('ZCARD', ak), redis.call('ZRANGE', ck, 0, listed - 1),
        redis.call('ZCARD', ck), redis.call('HGETALL', P .. 'steps:' .. id)}
