-- ARGV: prefix, grace_ms, error text before the type, error text after it, then the known types.
-- Pending jobs of a type neither known nor known to a worker alive (beat within the grace, or
-- within its own lease), due since before now - grace -> dead, applying their edges. Returns how many.
local grace = tonumber(ARGV[2])
local now = now_ms()
local cutoff = now - grace
local known = {}
for i = 5, #ARGV do known[ARGV[i]] = true end
local live = {}
local workers = redis.call('HGETALL', P .. 'workers')
for i = 2, #workers, 2 do
  local beat, lease, types = string.match(workers[i], '^(%d+)|(%d+)|(.*)$')
  if beat and (tonumber(beat) >= cutoff or tonumber(beat) + tonumber(lease) >= now) then
    local ok, list = pcall(cjson.decode, types)
    if ok and type(list) == 'table' then
      for _, t in ipairs(list) do live[t] = true end
    end
  end
end
local n = 0
for _, t in ipairs(redis.call('SMEMBERS', P .. 'ptypes')) do
  if not known[t] and not live[t] then
    local err = ARGV[3] .. t .. ARGV[4]
    for _, p in ipairs(redis.call('ZRANGE', P .. 'prios:' .. t, 0, -1)) do
      for _, id in ipairs(redis.call('ZRANGEBYSCORE', ready_key(t, p), '-inf', cutoff)) do
        redis.call('HSET', jkey(id), 'status', 'dead', 'error', err, 'updated', now)
        redis.call('HDEL', jkey(id), 'started')
        local f = redis.call('HMGET', jkey(id), 'ukey', 'expat', 'kids')
        free_key(id, t, f[1])
        if f[2] then expiring_rem(id, t) end
        redis.call('ZREM', ready_key(t, p), id)
        index_status(id, t, 'pending', 'dead')
        finish(id, 'dead', now)
        if f[3] then release_children(id, 'dead', now) end
        n = n + 1
      end
      index_head(t, p, now)
    end
  end
end
-- the keyed pending jobs (kpend:<type>, by run) of such types
for _, t in ipairs(redis.call('SMEMBERS', P .. 'ktypes')) do
  if not known[t] and not live[t] then
    local err = ARGV[3] .. t .. ARGV[4]
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'kpend:' .. t, '-inf', cutoff)) do
      local f = redis.call('HMGET', jkey(id), 'ukey', 'expat', 'lkey', 'run', 'kids')
      keyed_rem(id, t, f[4], f[3])
      redis.call('HSET', jkey(id), 'status', 'dead', 'error', err, 'updated', now)
      redis.call('HDEL', jkey(id), 'started')
      free_key(id, t, f[1])
      if f[2] then expiring_rem(id, t) end
      index_status(id, t, 'pending', 'dead')
      finish(id, 'dead', now)
      if f[5] then release_children(id, 'dead', now) end
      n = n + 1
    end
  end
end
publish_woken()
return n
