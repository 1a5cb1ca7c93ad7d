-- ARGV: prefix, name, tick, next_run, next_run in ms, now, then one job's 7 fields (as INSERT's),
-- or 12 (as INSERT_UNIQUE's) for a job with an expires_at, a limit key or unique_while "pending".
-- Fires a tick: only if the schedule is enabled and its next run is still ``tick``, inserts the job
-- and moves the schedule on; returns 1, or 0 with nothing written (another process fired it, or it changed).
local key = P .. 'sched:' .. ARGV[2]
local f = redis.call('HMGET', key, 'enabled', 'next')
if f[1] ~= '1' or f[2] ~= ARGV[3] then return 0 end
local n, err = insert_rows(ARGV, 7, 1, #ARGV - 6)
if not n then return redis.error_reply(err) end
redis.call('HSET', key, 'next', ARGV[4], 'last', ARGV[3], 'job', ARGV[7], 'updated', ARGV[6])
redis.call('ZADD', P .. 'scheds:due', ARGV[5], ARGV[2])
return 1
