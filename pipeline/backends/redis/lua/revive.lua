-- ARGV: prefix, id, '1' for a replay ('' if not), the step to replay from. dead or cancelled ->
-- pending: attempts, snoozes, the progress, the result and a cancel request reset, due now (the
-- error kept; its steps kept: it resumes). Returns 'ok', 'missing', the status, or 'held <id>': its
-- unique key is held by that waiting, pending, running or suspended job (refused). A job of
-- unique_while "pending" is never refused: it holds its key again only if no other job does.
-- A replay (issue 35's jobs retry --from-step) may revive a completed job too (REPLAY), and removes
-- the step of that name and every step first written after it (put_step's places); a job without
-- that step is refused: {'nostep', its step names in order}. Nothing is written before a refusal.
local id, replay, from = ARGV[2], ARGV[3] == '1', ARGV[4]
local key = jkey(id)
local f = redis.call('HMGET', key, 'status', 'type', 'prio', 'ukey', 'expat', 'lkey', 'uwhile')
if not f[1] then return 'missing' end
if f[1] ~= 'dead' and f[1] ~= 'cancelled' and not (replay and f[1] == 'completed') then return f[1] end
local sk = P .. 'steps:' .. id
local forget = {}
if replay then
  local steps = redis.call('HGETALL', sk)
  local at
  for i = 1, #steps, 2 do
    if steps[i] == from then at = tonumber(string.match(steps[i + 1], '^(%d+) ')) end
  end
  if not at then
    local names = {}
    for i = 1, #steps, 2 do names[tonumber(string.match(steps[i + 1], '^(%d+) '))] = steps[i] end
    local listed = {}
    for n = 1, #steps / 2 do listed[#listed + 1] = names[n] end
    return {'nostep', listed}
  end
  for i = 1, #steps, 2 do
    if tonumber(string.match(steps[i + 1], '^(%d+) ')) >= at then forget[#forget + 1] = steps[i] end
  end
end
if f[4] and f[7] then
  hold_again(id, f[2], f[4])
elseif f[4] then
  local holder = key_holder(f[2], f[4])
  if holder then return 'held ' .. holder end
  redis.call('HSET', P .. 'uniq:' .. f[2], f[4], id)
end
for i = 1, #forget, 1000 do redis.call('HDEL', sk, unpack(forget, i, math.min(i + 999, #forget))) end
local now = now_ms()
redis.call('HSET', key, 'status', 'pending', 'attempts', 0, 'run', now, 'updated', now)
redis.call('HDEL', key, 'started', 'snoozes', 'progress', 'pmsg', 'result', 'creq', 'await')
redis.call('ZREM', P .. 'done:' .. f[1], id)
index_status(id, f[2], f[1], 'pending')
to_pending(id, f[2], f[3], now, f[6], now)
if f[5] then expiring_add(id, f[2], f[5]) end
redis.call('PUBLISH', P .. 'wake', '1')
return 'ok'
