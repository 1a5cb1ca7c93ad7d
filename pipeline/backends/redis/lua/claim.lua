-- ARGV: prefix, owner, lease_ms, m, then per type: type, limit, start, global limit ('' for
-- none). For each type, its due pending jobs in claim order (priority, then run, then id), up
-- to limit, and for a type with a global limit, up to that limit less the type's running jobs
-- (ZCARD of st:running:<type>: the script runs alone, so nothing comes between count and claim);
-- the first ``start`` count their attempt now, the rest are claimed ahead. It visits only the
-- priorities with due jobs (pdue, once those of pwait that came due moved there): a claim costs
-- what it takes, not how many priorities wait. Returns, per type asked, how many it
-- got, then three values per lease: id, payload, and "attempts max token created run started"
-- (attempts: this one's; started 1/0), then " trace" if the job has a trace context: a third of the values of an array per lease, whose
-- parsing was a fifth of the client's time per claimed job.
-- A paused type (a field of ``paused``) is not claimed (0 jobs); before a type is claimed, its
-- pending jobs whose expires_at passed end cancelled (expire_due). Both cost one EXISTS per claim
-- while no type is paused and no pending job has an expires_at.
local owner, lease, m = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local expires = now + lease
local out = {}
local any_paused = redis.call('EXISTS', P .. 'paused') == 1
local any_expiring = redis.call('EXISTS', P .. 'etypes') == 1
for j = 0, m - 1 do
  local t, want, k, cap = ARGV[5 + j * 4], tonumber(ARGV[6 + j * 4]), tonumber(ARGV[7 + j * 4]), ARGV[8 + j * 4]
  local got = 0
  local count_at = #out + 1
  out[count_at] = 0
  if any_paused and redis.call('HEXISTS', P .. 'paused', t) == 1 then want = 0 end
  if any_expiring and want > 0 then expire_due(t, now) end
  local pending_key, running_key = P .. 'st:pending:' .. t, P .. 'st:running:' .. t
  if cap ~= '' then want = math.min(want, tonumber(cap) - redis.call('ZCARD', running_key)) end
  local due_key, wait_key, prios_key = P .. 'pdue:' .. t, P .. 'pwait:' .. t, P .. 'prios:' .. t
  if redis.call('ZCARD', due_key) + redis.call('ZCARD', wait_key) ~= redis.call('ZCARD', prios_key) then
    -- a priority written or emptied without the index (by a process of layout 1 still running
    -- after the upgrade): file every priority of the type again
    redis.call('DEL', due_key, wait_key)
    for _, p in ipairs(redis.call('ZRANGE', prios_key, 0, -1)) do index_head(t, p, now) end
  end
  local came = redis.call('ZRANGEBYSCORE', wait_key, '-inf', now)
  if #came > 0 then
    for _, p in ipairs(came) do redis.call('ZADD', due_key, p, p) end
    redis.call('ZREMRANGEBYSCORE', wait_key, '-inf', now)
  end
  while got < want do
    -- every priority of pdue has a due job: the lowest (want - got) are all this pass can use
    local prios = redis.call('ZRANGE', due_key, 0, want - got - 1)
    if #prios == 0 then break end
    for _, p in ipairs(prios) do
      if got >= want then break end
      local rk = ready_key(t, p)
      local ids = redis.call('ZRANGEBYSCORE', rk, '-inf', now, 'LIMIT', 0, want - got)
      if #ids > 0 then
        for _, id in ipairs(ids) do
          local key = jkey(id)
          local f = redis.call('HMGET', key, 'payload', 'max', 'created', 'run', 'attempts', 'token', 'started', 'trace',
                               'expat')
          local token = tonumber(f[6]) + 1
          local attempts = tonumber(f[5]) + 1  -- the attempt this lease is, counted now or at its START
          if got < k then
            redis.call('HSET', key, 'status', 'running', 'owner', owner, 'expires', expires, 'updated', now,
                       'token', token, 'attempts', attempts, 'started', now)
          else
            redis.call('HSET', key, 'status', 'running', 'owner', owner, 'expires', expires, 'updated', now,
                       'token', token)
            if f[7] then redis.call('HDEL', key, 'started') end
          end
          redis.call('ZADD', P .. 'leases', expires, id)
          if f[9] then expiring_rem(id, t) end
          redis.call('ZREM', P .. 'status:pending', id)
          redis.call('ZREM', pending_key, id)
          redis.call('ZADD', P .. 'status:running', 0, id)
          redis.call('ZADD', running_key, 0, id)
          out[#out + 1] = id
          out[#out + 1] = f[1]
          out[#out + 1] = attempts .. ' ' .. f[2] .. ' ' .. token .. ' ' .. f[3] .. ' ' .. f[4] .. ' ' .. (got < k and 1 or 0)
                         .. (f[8] and (' ' .. f[8]) or '')
          got = got + 1
        end
        -- the ids taken are the set's first ones: everything scored below them was taken too
        redis.call('ZREMRANGEBYRANK', rk, 0, #ids - 1)
      end
      index_head(t, p, now)  -- out of pdue once nothing due is left (the loop's progress when none was)
    end
  end
  out[count_at] = got
end
return out
