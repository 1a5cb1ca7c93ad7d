-- ARGV: prefix, the error of a job cancelled while pending or waiting (base.cancelled_error), then
-- ids. In order, per id, what the job is after the call: 'cancelled' for a pending one (cancelled
-- now: out of its ready set, the claim's index and expiring:<t>, into done:cancelled, its unique key
-- freed) or a waiting one (the same: it is in none of those sets), either applying its edges
-- (release_children), or a suspended one (the same: out of the suspended set, its await field
-- cleared; its steps kept); 'cancelling' for a running one (field creq set, its id in creq:<owner>: its worker
-- stops it, see CANCEL_REQUESTS); the status of a final one, unchanged; '' for an unknown id.
-- An id given twice is answered twice (the second time: 'cancelled').
local now = now_ms()
local out = {}
local touched = {}  -- type NUL priority -> {type, priority} of the ready sets that lost jobs
for i = 3, #ARGV do
  local id = ARGV[i]
  local key = jkey(id)
  local f = redis.call('HMGET', key, 'status', 'type', 'prio', 'ukey', 'expat', 'owner', 'creq', 'lkey', 'run', 'kids')
  local t = f[2]
  if not f[1] then
    out[#out + 1] = ''
  elseif f[1] == 'pending' then
    if f[8] then
      keyed_rem(id, t, f[9], f[8])
    else
      redis.call('ZREM', ready_key(t, f[3]), id)
      touched[t .. '\0' .. f[3]] = {t, f[3]}
    end
    if f[5] then expiring_rem(id, t) end
    cancel_pending(id, key, t, f[4], ARGV[2], now, f[10])
    out[#out + 1] = 'cancelled'
  elseif f[1] == 'waiting' then
    cancel_waiting(id, key, t, f[4], ARGV[2], now)
    if f[10] then release_children(id, 'cancelled', now) end
    out[#out + 1] = 'cancelled'
  elseif f[1] == 'suspended' then
    redis.call('ZREM', P .. 'suspended', id)
    redis.call('HSET', key, 'status', 'cancelled', 'updated', now, 'error', ARGV[2])
    redis.call('HDEL', key, 'await')
    index_status(id, t, 'suspended', 'cancelled')
    finish(id, 'cancelled', now)
    free_key(id, t, f[4])
    if f[10] then release_children(id, 'cancelled', now) end
    out[#out + 1] = 'cancelled'
  elseif f[1] == 'running' then
    if not f[7] then
      redis.call('HSET', key, 'creq', '1')
      redis.call('SADD', P .. 'creq:' .. f[6], id)
    end
    out[#out + 1] = 'cancelling'
  else
    out[#out + 1] = f[1]
  end
end
for _, tp in pairs(touched) do index_head(tp[1], tp[2], now) end
publish_woken()
return out
