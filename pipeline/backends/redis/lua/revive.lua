-- ARGV: prefix, id. dead or cancelled -> pending: attempts, snoozes, the progress, the result
-- and a cancel request reset, due now (the error kept). Returns 'ok', 'missing', the status, or
-- 'held <id>': its unique key is held by that pending or running job (refused). A job of
-- unique_while "pending" is never refused: it holds its key again only if no other job does.
local id = ARGV[2]
local key = jkey(id)
local f = redis.call('HMGET', key, 'status', 'type', 'prio', 'ukey', 'expat', 'lkey', 'uwhile')
if not f[1] then return 'missing' end
if f[1] ~= 'dead' and f[1] ~= 'cancelled' then return f[1] end
if f[4] and f[7] then
  hold_again(id, f[2], f[4])
elseif f[4] then
  local holder = key_holder(f[2], f[4])
  if holder then return 'held ' .. holder end
  redis.call('HSET', P .. 'uniq:' .. f[2], f[4], id)
end
local now = now_ms()
redis.call('HSET', key, 'status', 'pending', 'attempts', 0, 'run', now, 'updated', now)
redis.call('HDEL', key, 'started', 'snoozes', 'progress', 'pmsg', 'result', 'creq')
redis.call('ZREM', P .. 'done:' .. f[1], id)
index_status(id, f[2], f[1], 'pending')
to_pending(id, f[2], f[3], now, f[6], now)
if f[5] then expiring_add(id, f[2], f[5]) end
redis.call('PUBLISH', P .. 'wake', '1')
return 'ok'
