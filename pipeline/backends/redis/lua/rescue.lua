-- ARGV: prefix, n, the error of a cancelled run, then 7 per job: id, token, attempts, started
-- (1/0), dead (1/0), delay_ms, error. Each fenced by what EXPIRED read (running, token, attempts,
-- started) and by its lease having run out still (a renewal since then keeps it): rescuers
-- running at once move each job once. A job that never started goes back in its place with
-- nothing counted. A job whose cancel was requested ends cancelled, started or not, whatever was
-- decided for it. A keyed job leaves its key's running set; a job of unique_while "pending" back to
-- pending holds its key again if it is free. A job that ends (dead, cancelled) applies its edges
-- (release_children). Returns how many moved.
local n = tonumber(ARGV[2])
local now = now_ms()
local moved = 0
for i = 0, n - 1 do
  local b = 4 + i * 7
  local id, token, attempts, started, dead = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  local key = jkey(id)
  local f = redis.call('HMGET', key, 'status', 'token', 'attempts', 'started', 'expires', 'type', 'prio', 'run', 'ukey',
                       'creq', 'expat', 'lkey', 'uwhile', 'kids')
  if f[1] == 'running' and f[2] == token and f[3] == attempts and ((f[4] and '1' or '0') == started)
     and tonumber(f[5]) < now then
    local t, p = f[6], f[7]
    moved = moved + 1
    redis.call('ZREM', P .. 'leases', id)
    off_running(id, t, f[12])
    if f[10] then drop_request(id, key) end
    redis.call('HDEL', key, 'owner', 'expires', 'started')
    if f[10] then
      redis.call('HSET', key, 'status', 'cancelled', 'updated', now, 'error', ARGV[3])
      index_status(id, t, 'running', 'cancelled')
      finish(id, 'cancelled', now)
      free_key(id, t, f[9])
      if f[14] then release_children(id, 'cancelled', now) end
    elseif started == '0' then
      redis.call('HSET', key, 'status', 'pending', 'updated', now)
      redis.call('HDEL', key, 'progress', 'pmsg')
      index_status(id, t, 'running', 'pending')
      to_pending(id, t, p, f[8], f[12], now)
      if f[11] then expiring_add(id, t, f[11]) end
      if f[13] and f[9] then hold_again(id, t, f[9]) end
    elseif dead == '1' then
      redis.call('HSET', key, 'status', 'dead', 'updated', now, 'error', ARGV[b + 6])
      index_status(id, t, 'running', 'dead')
      finish(id, 'dead', now)
      free_key(id, t, f[9])
      if f[14] then release_children(id, 'dead', now) end
    else
      local run = now + tonumber(ARGV[b + 5])
      redis.call('HSET', key, 'status', 'pending', 'updated', now, 'run', run, 'error', ARGV[b + 6])
      redis.call('HDEL', key, 'progress', 'pmsg')
      index_status(id, t, 'running', 'pending')
      to_pending(id, t, p, run, f[12], now)
      if f[11] then expiring_add(id, t, f[11]) end
      if f[13] and f[9] then hold_again(id, t, f[9]) end
    end
  end
end
publish_woken()
return moved
