-- ARGV: prefix, id, the signal's name, its payload ('v' then its JSON text, or '' for none), '1' if
-- it has a key ('' if not), the key. Kept for the job (sig:<id>, see the prelude), consumed later
-- by one wait (take_signal); a job suspended awaiting this name goes pending due now (RESUME), and
-- the Pollers are woken as an insert wakes them (PUBLISH wake). Returns 'woken' or 'kept'; else,
-- writing nothing: 'missing' (no such job), 'used' (a signal with this key was sent to the job
-- already, of any name: looked at before its status), or the status of a finished job. Atomic against a SUSPEND: one sent while
-- the job still runs is kept, and its SUSPEND finds it.
local id, name = ARGV[2], ARGV[3]
local key = jkey(id)
local f = redis.call('HMGET', key, 'status', 'await')
if not f[1] then return 'missing' end
local sk = P .. 'sig:' .. id
-- the key first: a link pressed again after its signal finished the job is 'used', not finished
if ARGV[5] == '1' and redis.call('HEXISTS', sk, 'k:' .. ARGV[6]) == 1 then return 'used' end
if is_final(f[1]) then return f[1] end
if ARGV[5] == '1' then redis.call('HSET', sk, 'k:' .. ARGV[6], '1') end
local i = redis.call('HINCRBY', sk, 't:' .. name, 1)
redis.call('HSET', sk, 'e:' .. i .. ':' .. name, ARGV[4])
if f[1] == 'suspended' and f[2] == name then
  local now = now_ms()
  resume(id, key, now, now)
  redis.call('PUBLISH', P .. 'wake', '1')
  return 'woken'
end
return 'kept'
