-- ARGV: prefix, owner, lease_ms, m, then per type: type, limit, start, global limit, rate limit's N,
-- its window (ms), key limit ('' for none of the last four). For each type, its due pending jobs in
-- claim order (priority, then run, then id), up to limit, and for a type with a global limit, up to
-- that limit less the type's running jobs (ZCARD of st:running:<type>: the script runs alone, so
-- nothing comes between count and claim); the first ``start`` count their attempt now, the rest are
-- claimed ahead. It visits only the priorities with due jobs (pdue, once those of pwait that came
-- due moved there): a claim costs what it takes, not how many priorities wait. Returns, per type
-- asked, how many it got, then three values per lease: id, payload, and "attempts max token
-- created run started expat" (attempts: this one's; started 1/0; expat: its expires_at, '-' for none;
-- the worker that takes a job claimed ahead checks it), then " trace" if the job has a trace
-- context: a third of the values of an array per lease, whose parsing was a fifth of the client's
-- time per claimed job.
-- A paused type (a field of ``paused``) is not claimed (0 jobs); before a type is claimed, its
-- pending jobs whose expires_at passed end cancelled (expire_due), applying their edges.
-- Issue 23's limits: a rate-limited type (N per window) takes at most N less the claims rate:<type>
-- holds within the last window (its older records dropped first), and records each claim there
-- (score: now, member: id:token). A type with keyed pending jobs (ktypes: see the prelude) is
-- claimed by claim_keyed: round-robin across keys under a key limit, else in claim order across
-- keys and the unkeyed jobs. A claim of none of these (nothing paused, expiring nor keyed, no rate)
-- costs one EXISTS beyond the jobs it takes.
-- A job of unique_while "pending" frees its unique key as it is claimed.
local owner, lease, m = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local expires = now + lease
local out = {}
local any = redis.call('EXISTS', P .. 'paused', P .. 'etypes', P .. 'ktypes') > 0
local any_paused = any and redis.call('EXISTS', P .. 'paused') == 1
local any_expiring = any and redis.call('EXISTS', P .. 'etypes') == 1
local any_keyed = any and redis.call('EXISTS', P .. 'ktypes') == 1
local MAX_KEYS = 1000  -- keys a claim visits at most (those at their limit included)
local MOVE_MAX = 5000  -- keyed jobs that came due moved to their key's set per claim at most

-- per type, while it is claimed
local t, got, k, pending_key, running_key
local taken  -- id:token of each job claimed, for the rate log (nil: the type has no rate limit)

-- pending -> running, one job (its sets are the caller's to update); lk: its limit key, or nil
local function take(id, lk)
  local key = jkey(id)
  local f = redis.call('HMGET', key, 'payload', 'max', 'created', 'run', 'attempts', 'token', 'started', 'trace',
                       'expat', 'ukey', 'uwhile')
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
  if f[11] then free_key(id, t, f[10]) end
  redis.call('ZREM', pending_key, id)  -- (no status:pending or status:running: the prelude's HOT)
  redis.call('ZADD', running_key, 0, id)
  if lk then
    redis.call('ZREM', P .. 'kpend:' .. t, id)
    redis.call('SADD', kname('krun', t, lk), id)
  end
  out[#out + 1] = id
  out[#out + 1] = f[1]
  out[#out + 1] = attempts .. ' ' .. f[2] .. ' ' .. token .. ' ' .. f[3] .. ' ' .. f[4] .. ' ' .. (got < k and 1 or 0)
                 .. ' ' .. (f[9] or '-') .. (f[8] and (' ' .. f[8]) or '')
  got = got + 1
  if taken then taken[#taken + 1] = id .. ':' .. token end
end

-- claim order of two jobs {priority, run, id}: ids compared byte by byte, as a sorted set orders
-- its members (Lua's < on strings follows the server's locale)
local function before(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  if a[2] ~= b[2] then return a[2] < b[2] end
  local x, y = a[3], b[3]
  if x == y then return false end
  for i = 1, math.min(#x, #y) do
    local c, d = string.byte(x, i), string.byte(y, i)
    if c ~= d then return c < d end
  end
  return #x < #y
end
local function of_member(prio, m)  -- a kready member (kmember) as {priority, run, id}
  return {tonumber(prio), tonumber(string.sub(m, 1, 16)) - 1e15, string.sub(m, 17)}
end

-- The unkeyed jobs of a keyed type: one group, its first ``want`` due jobs in claim order
-- ({priority, run, id, priority as stored}), read from the ready sets, not taken yet.
local function unkeyed_due(due_key, want)
  local jobs, off = {}, 0
  while #jobs < want do
    local prios = redis.call('ZRANGE', due_key, off, off + want - #jobs - 1)
    if #prios == 0 then break end
    off = off + #prios
    for _, p in ipairs(prios) do
      if #jobs >= want then break end
      local r = redis.call('ZRANGEBYSCORE', ready_key(t, p), '-inf', now, 'WITHSCORES', 'LIMIT', 0, want - #jobs)
      for i = 1, #r, 2 do jobs[#jobs + 1] = {tonumber(p), tonumber(r[i + 1]), r[i], p} end
    end
  end
  return jobs
end
local function unkeyed_taken(jobs, n)  -- out of their ready sets, the first n of ``jobs`` (taken)
  local per = {}
  local order = {}
  for i = 1, n do
    local p = jobs[i][4]
    if not per[p] then per[p] = 0; order[#order + 1] = p end
    per[p] = per[p] + 1
  end
  for _, p in ipairs(order) do
    redis.call('ZREMRANGEBYRANK', ready_key(t, p), 0, per[p] - 1)  -- its first ones: taken in order
    index_head(t, p, now)
  end
end
local function key_taken(g, n)  -- a key's first n jobs taken: out of kready, the key's new head filed
  if n == 0 then return end
  local heads = P .. 'kheads:' .. t
  redis.call('ZREMRANGEBYRANK', g.rk, 0, n - 1)
  redis.call('ZREM', heads, g.head)
  local h = redis.call('ZRANGE', g.rk, 0, 0, 'WITHSCORES')
  if h[1] then redis.call('ZADD', heads, h[2], h[1]) end
end
local function key_group(prio, m)  -- the key of a head in kheads, its set and first job
  local head = of_member(prio, m)
  local lk = redis.call('HGET', jkey(head[3]), 'lkey')
  return {key = lk, rk = kname('kready', t, lk), head = m, jobs = {head}, n = 0}  -- n: taken (cap: may take)
end

-- A type with keyed pending jobs: the keyed jobs that came due move to their key's set; then
-- with a key limit, round-robin: the groups (each key with room, and the unkeyed jobs as one
-- group of no limit) in the claim order of their first due job; round 1 takes each one's first
-- job, round 2 each one's second, and so on, until ``want``; keys visited: until ``want`` groups
-- have room, at most MAX_KEYS. Without one, in claim order across the keys and the unkeyed
-- jobs (the first ``want`` keys by head can hold them all). Reads bounded by the keys visited
-- and the jobs taken, whatever the keys' backlogs.
local function claim_keyed(want, limit, due_key)
  local wk = P .. 'kwait:' .. t
  local came = redis.call('ZRANGEBYSCORE', wk, '-inf', now, 'LIMIT', 0, MOVE_MAX)
  for _, id in ipairs(came) do
    local f = redis.call('HMGET', jkey(id), 'prio', 'run', 'lkey')
    kready_add(t, f[3], f[1], kmember(f[2], id))
  end
  for i = 1, #came, 1000 do redis.call('ZREM', wk, unpack(came, i, math.min(i + 999, #came))) end
  local free = unkeyed_due(due_key, want)
  local heads_key = P .. 'kheads:' .. t
  if limit then
    local groups = {}
    local null = #free > 0 and {null = true, cap = #free} or nil
    local visited, off = 0, 0
    while #groups < want and visited < MAX_KEYS do
      local h = redis.call('ZRANGE', heads_key, off, off + math.min(MAX_KEYS - visited, want - #groups + 8) - 1,
                           'WITHSCORES')
      if #h == 0 then break end
      off = off + #h / 2
      for i = 1, #h, 2 do
        if null and before(free[1], of_member(h[i + 1], h[i])) then
          groups[#groups + 1] = null
          null = nil
        end
        if #groups >= want or visited >= MAX_KEYS then break end
        visited = visited + 1
        local g = key_group(h[i + 1], h[i])
        local room = limit - redis.call('SCARD', kname('krun', t, g.key))
        if room > 0 then
          g.cap = math.min(room, redis.call('ZCARD', g.rk))
          groups[#groups + 1] = g
        end
      end
    end
    if null and #groups < want then groups[#groups + 1] = null end
    local alloc, total, more = {}, 0, true
    for i = 1, #groups do alloc[i] = 0 end
    while total < want and more do
      more = false
      for i, g in ipairs(groups) do
        if total < want and alloc[i] < g.cap then
          alloc[i] = alloc[i] + 1
          total = total + 1
          more = true
        end
      end
    end
    local rounds = 0
    for i, g in ipairs(groups) do
      if not g.null and alloc[i] > 0 then g.members = redis.call('ZRANGE', g.rk, 0, alloc[i] - 1) end
      rounds = math.max(rounds, alloc[i])
    end
    for r = 1, rounds do
      for i, g in ipairs(groups) do
        if alloc[i] >= r then
          if g.null then take(free[r][3], nil) else take(string.sub(g.members[r], 17), g.key) end
        end
      end
    end
    for i, g in ipairs(groups) do
      if g.null then unkeyed_taken(free, alloc[i]) else key_taken(g, alloc[i]) end
    end
  else
    local groups = {}
    local h = redis.call('ZRANGE', heads_key, 0, want - 1, 'WITHSCORES')
    for i = 1, #h, 2 do groups[#groups + 1] = key_group(h[i + 1], h[i]) end
    local function next_of(g)  -- a key's next job, its set read a part at a time
      if g.n >= #g.jobs and not g.all then
        local more = redis.call('ZRANGE', g.rk, #g.jobs, #g.jobs + want - 1, 'WITHSCORES')
        for j = 1, #more, 2 do g.jobs[#g.jobs + 1] = of_member(more[j + 1], more[j]) end
        g.all = #more < 2 * want
      end
      return g.jobs[g.n + 1]
    end
    local nf = 0  -- unkeyed jobs taken
    while got < want do
      local best, bg = free[nf + 1], nil
      for _, g in ipairs(groups) do
        local job = next_of(g)
        if job and (not best or before(job, best)) then best, bg = job, g end
      end
      if not best then break end
      if bg then
        bg.n = bg.n + 1
        take(best[3], bg.key)
      else
        nf = nf + 1
        take(best[3], nil)
      end
    end
    unkeyed_taken(free, nf)
    for _, g in ipairs(groups) do key_taken(g, g.n) end
  end
  if redis.call('EXISTS', P .. 'kpend:' .. t) == 0 then redis.call('SREM', P .. 'ktypes', t) end
end

for j = 0, m - 1 do
  local b = 5 + j * 7
  t, got, k = ARGV[b], 0, tonumber(ARGV[b + 2])
  local want, cap, rate, window, limit = tonumber(ARGV[b + 1]), ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6]
  local count_at = #out + 1
  out[count_at] = 0
  if any_paused and redis.call('HEXISTS', P .. 'paused', t) == 1 then want = 0 end
  if any_expiring and want > 0 then expire_due(t, now) end
  pending_key, running_key = P .. 'st:pending:' .. t, P .. 'st:running:' .. t
  if cap ~= '' then want = math.min(want, tonumber(cap) - redis.call('ZCARD', running_key)) end
  local rate_key
  taken = nil
  if rate ~= '' and want > 0 then
    rate_key = P .. 'rate:' .. t
    redis.call('ZREMRANGEBYSCORE', rate_key, '-inf', now - tonumber(window))  -- a claim at now - window is out of it
    want = math.min(want, tonumber(rate) - redis.call('ZCARD', rate_key))
    taken = {}
  end
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
  if any_keyed and want > 0 and redis.call('SISMEMBER', P .. 'ktypes', t) == 1 then
    claim_keyed(want, limit ~= '' and tonumber(limit) or nil, due_key)
    want = got  -- (it took every job it could: the loop below is the other types')
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
        for _, id in ipairs(ids) do take(id, nil) end
        -- the ids taken are the set's first ones: everything scored below them was taken too
        redis.call('ZREMRANGEBYRANK', rk, 0, #ids - 1)
      end
      index_head(t, p, now)  -- out of pdue once nothing due is left (the loop's progress when none was)
    end
  end
  if taken and #taken > 0 then
    for i = 1, #taken, 500 do
      local args = {}
      for n = i, math.min(i + 499, #taken) do
        args[#args + 1] = now
        args[#args + 1] = taken[n]
      end
      redis.call('ZADD', rate_key, unpack(args))
    end
    if tonumber(window) > 0 then redis.call('PEXPIRE', rate_key, window) end
  end
  out[count_at] = got
end
publish_woken()  -- (jobs woken by the edges of jobs that expired)
return out
