"""Every Lua script of the Redis job store, by name: one script per transition.

Each script runs atomically on the server (nothing else runs meanwhile), reads "now" from the
server's own ``TIME`` (one clock for every process), and checks the same fence as SQLite's
``WHERE id = ? AND status = 'running' AND lease_token = ?`` before it changes a running job.
A script that fails part-way is not rolled back by Redis, so each one validates everything
(duplicate ids, the fence) before its first write.

``ARGV[1]`` is always the key prefix (``{name}:``; the braces are a hash tag, so every key of
one store hashes to one slot). Keys (layout in docs/backends.md, "Key layout"):

    job:<id>              HASH  type payload status attempts max run prio created updated
                                token [error] [owner expires] [started] [ukey]   (times: epoch ms)
    ready:<type>:<prio>   ZSET  pending jobs of one type and priority, score run (ms), member id:
                                due ones are a range by score; ties go by id (member order)
    prios:<type>          ZSET  the priorities that have a ready set, score = priority
    pdue:<type>           ZSET  the claim's index: those of them whose first job is due, score = priority
    pwait:<type>          ZSET  and the others, score = when their first job is due (ms); every script
                                that adds to or takes from a ready set keeps the two in step
    ptypes                SET   the types that have pending jobs
    leases                ZSET  running jobs, score = lease expiry (ms)
    all, type:<t>, status:<s>, st:<s>:<t>
                          ZSET  every job / of a type / of a status / both, score 0: lexicographic
                                by id, which is time-ordered (UUID v7): newest first is a reverse range
                                (ZCARD of st:running:<t>: what a type's global limit counts)
    done:<s>              ZSET  completed / dead jobs, score = when they finished (ms)
    types                 SET   every type that has a job
    uniq:<type>           HASH  unique key -> id of the pending or running job of that type holding
                                it (job field ukey); deleted when that job finishes, dies or is
                                deleted. A hash per type: a type name may hold ':', a key anything
    workers               HASH  owner -> "beat_ms|lease_ms|<json list of types>"
    schema                STRING the key layout's version (2: with pdue/pwait; 1 is upgraded at open)
    sched:<name>          HASH  a cron schedule: type payload cron tz enabled origin declared next
                                [last job] created updated (times: the protocol's ISO text)
    scheds                SET   the names of every schedule
    scheds:due            ZSET  the enabled schedules, score = next run (ms): the due ones are a range
    wake                  pub/sub channel: a job became due (insert, release, revive)
"""

from __future__ import annotations

import hashlib

import attrs

# Functions every script shares. (Prepended to each: Redis scripts cannot import.)
_PRELUDE = r"""
local P = ARGV[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor((tonumber(t[2]) + 500) / 1000)
end
local function jkey(id) return P .. 'job:' .. id end
local function ready_key(t, p) return P .. 'ready:' .. t .. ':' .. p end
local function index_status(id, t, from, to)
  if from then
    redis.call('ZREM', P .. 'status:' .. from, id)
    redis.call('ZREM', P .. 'st:' .. from .. ':' .. t, id)
  end
  if to then
    redis.call('ZADD', P .. 'status:' .. to, 0, id)
    redis.call('ZADD', P .. 'st:' .. to .. ':' .. t, 0, id)
  end
end
-- The claim's index of a type's priorities (prios:<t> holds them all): pdue:<t> those whose
-- first job is due (score: the priority), pwait:<t> the others (score: their first job's run).
-- A claim moves the ones that came due from pwait to pdue and reads pdue from its lowest
-- priority only as far as it takes jobs: never a priority with nothing due.
local function index_add(t, p, run, now)
  -- a job due at ``run`` joined ready:<t>:<p>
  local due = P .. 'pdue:' .. t
  if redis.call('ZSCORE', due, p) then return end
  local wait = P .. 'pwait:' .. t
  if tonumber(run) <= now then
    redis.call('ZADD', due, p, p)
    redis.call('ZREM', wait, p)
  else
    local first = redis.call('ZSCORE', wait, p)
    if not first or tonumber(run) < tonumber(first) then redis.call('ZADD', wait, run, p) end
  end
end
local function index_head(t, p, now)
  -- ready:<t>:<p> lost jobs: file the priority by its first job now; an empty ZSET is no key, so
  -- drop the priority then, and the type once it has none
  local head = redis.call('ZRANGE', ready_key(t, p), 0, 0, 'WITHSCORES')
  local due, wait = P .. 'pdue:' .. t, P .. 'pwait:' .. t
  if not head[2] then
    redis.call('ZREM', due, p)
    redis.call('ZREM', wait, p)
    redis.call('ZREM', P .. 'prios:' .. t, p)
    if redis.call('EXISTS', P .. 'prios:' .. t) == 0 then redis.call('SREM', P .. 'ptypes', t) end
  elseif tonumber(head[2]) <= now then
    redis.call('ZADD', due, p, p)
    redis.call('ZREM', wait, p)
  else
    redis.call('ZREM', due, p)
    redis.call('ZADD', wait, head[2], p)
  end
end
local function make_ready(id, t, p, run, now)
  redis.call('ZADD', ready_key(t, p), run, id)
  redis.call('ZADD', P .. 'prios:' .. t, p, p)
  redis.call('SADD', P .. 'ptypes', t)
  index_add(t, p, run, now)
end
local function unready(id, t, p)
  redis.call('ZREM', ready_key(t, p), id)
  index_head(t, p, now_ms())
end
local function finish(id, status, now)
  redis.call('ZADD', P .. 'done:' .. status, now, id)
end
-- the pending or running job holding a type's unique key, or nil
local function key_holder(t, k)
  local holder = redis.call('HGET', P .. 'uniq:' .. t, k)
  if not holder then return nil end
  local status = redis.call('HGET', jkey(holder), 'status')
  if status == 'pending' or status == 'running' then return holder end
  return nil  -- (a stale entry: its job left pending and running without freeing it)
end
-- a job that leaves pending and running for good frees its unique key (k: its ukey field, or nil)
local function free_key(id, t, k)
  if k and redis.call('HGET', P .. 'uniq:' .. t, k) == id then redis.call('HDEL', P .. 'uniq:' .. t, k) end
end
-- rows: a flat list, ``width`` per job from ``first``: 7 (id, type, payload, max, run, prio,
-- created), or 8 with the unique key ('' for none). Returns how many were inserted and, for
-- each row not inserted because a pending or running job holds its type and key (or an earlier
-- row of the call), its id and the holder's; or nil and the id that already exists.
local function insert_rows(rows, first, n, width)
  local seen = {}
  local held = {}  -- row index -> holder id
  local taken = {}  -- type NUL key -> id, for the keys this call takes
  local dups = {}
  for i = 0, n - 1 do
    local b = first + i * width
    local id = rows[b]
    if seen[id] or redis.call('EXISTS', jkey(id)) == 1 then
      return nil, id
    end
    seen[id] = true
    local k = width == 8 and rows[b + 7] or ''
    if k ~= '' then
      local tk = rows[b + 1] .. '\0' .. k
      local holder = taken[tk] or key_holder(rows[b + 1], k)
      if holder then
        held[i] = holder
        dups[#dups + 1] = id
        dups[#dups + 1] = holder
      else
        taken[tk] = id
      end
    end
  end
  local now = now_ms()
  local due = false
  local known = {}  -- (type, priority) whose sets this call wrote already -> the earliest run given
  local inserted = 0
  for i = 0, n - 1 do
    local b = first + i * width
    local id, t, p, run = rows[b], rows[b + 1], rows[b + 5], rows[b + 4]
    local k = width == 8 and rows[b + 7] or ''
    if not held[i] then
      inserted = inserted + 1
      redis.call('HSET', jkey(id), 'type', t, 'payload', rows[b + 2], 'status', 'pending', 'attempts', 0,
                 'max', rows[b + 3], 'run', run, 'prio', p, 'created', rows[b + 6], 'updated', rows[b + 6], 'token', 0)
      if k ~= '' then
        redis.call('HSET', jkey(id), 'ukey', k)
        redis.call('HSET', P .. 'uniq:' .. t, k, id)
      end
      local tp = t .. '\0' .. p
      if known[tp] then
        redis.call('ZADD', ready_key(t, p), run, id)
        if tonumber(run) < known[tp] then
          known[tp] = tonumber(run)
          index_add(t, p, run, now)
        end
      else
        make_ready(id, t, p, run, now)
        redis.call('SADD', P .. 'types', t)
        known[tp] = tonumber(run)
      end
      redis.call('ZADD', P .. 'all', 0, id)
      redis.call('ZADD', P .. 'type:' .. t, 0, id)
      index_status(id, t, nil, 'pending')
      if tonumber(run) <= now then due = true end
    end
  end
  if due then redis.call('PUBLISH', P .. 'wake', '1') end
  return inserted, nil, dups
end
local function remove_job(id, f_status, t, p, k)
  if f_status == 'pending' then unready(id, t, p) end
  if f_status == 'pending' or f_status == 'running' then free_key(id, t, k) end
  redis.call('ZREM', P .. 'done:' .. f_status, id)
  index_status(id, t, f_status, nil)
  redis.call('ZREM', P .. 'all', id)
  redis.call('ZREM', P .. 'type:' .. t, id)
  redis.call('DEL', jkey(id))
  if redis.call('EXISTS', P .. 'type:' .. t) == 0 then redis.call('SREM', P .. 'types', t) end
end
"""

# -- producing ----------------------------------------------------------------------------------

# ARGV: prefix, n, then 7 per job (none has a unique key: INSERT_UNIQUE's). Every row or none:
# a duplicate id (stored, or twice in the call) is found before the first write. Returns n.
INSERT = r"""
local n, dup = insert_rows(ARGV, 3, tonumber(ARGV[2]), 7)
if not n then return redis.error_reply('DUPLICATE a job with id ' .. dup .. ' already exists') end
return n
"""

# ARGV: prefix, n, then 8 per job, the last its unique key ('' for none). As INSERT, but a row
# whose key a pending or running job holds is not inserted. Returns how many were inserted if
# every row was, else that count, then the id and the holder's id of each row not inserted.
INSERT_UNIQUE = r"""
local n, dup, held = insert_rows(ARGV, 3, tonumber(ARGV[2]), 8)
if not n then return redis.error_reply('DUPLICATE a job with id ' .. dup .. ' already exists') end
if #held == 0 then return n end
table.insert(held, 1, n)
return held
"""

# ARGV: prefix, staging list, answer key. A bulk load's part, pushed to a list of its own first
# (not job state: nothing claims it; 8 values per row, as INSERT_UNIQUE's), committed here in
# one step, every row or none; the list is deleted. Answers as INSERT_UNIQUE, and keeps that
# answer under the answer key for a day: run again (its first answer lost with a connection),
# it answers the same and inserts nothing more, so a caller can always learn what happened.
INSERT_STAGED = r"""
local kept = redis.call('GET', ARGV[3])
if kept then
  local answer = cjson.decode(kept)
  if answer.err then return redis.error_reply(answer.err) end
  return answer.ok
end
if redis.call('EXISTS', ARGV[2]) == 0 then
  return redis.error_reply('GONE the staged rows of ' .. ARGV[2] .. ' are gone (expired): nothing of them was inserted')
end
local rows = redis.call('LRANGE', ARGV[2], 0, -1)
redis.call('DEL', ARGV[2])
local n, dup, held = insert_rows(rows, 1, #rows / 8, 8)
local answer
if not n then
  answer = {err = 'DUPLICATE a job with id ' .. dup .. ' already exists'}
elseif #held == 0 then
  answer = {ok = n}
else
  table.insert(held, 1, n)
  answer = {ok = held}
end
redis.call('SET', ARGV[3], cjson.encode(answer), 'EX', 86400)
if answer.err then return redis.error_reply(answer.err) end
return answer.ok
"""

# -- claim -------------------------------------------------------------------------------------

# ARGV: prefix, owner, lease_ms, m, then per type: type, limit, start, global limit ('' for
# none). For each type, its due pending jobs in claim order (priority, then run, then id), up
# to limit, and for a type with a global limit, up to that limit less the type's running jobs
# (ZCARD of st:running:<type>: the script runs alone, so nothing comes between count and claim);
# the first ``start`` count their attempt now, the rest are claimed ahead. It visits only the
# priorities with due jobs (pdue, once those of pwait that came due moved there): a claim costs
# what it takes, not how many priorities wait. Returns, per type asked, how many it
# got, then three values per lease: id, payload, and "attempts max token created run started"
# (attempts: this one's; started 1/0): a third of the values of an array per lease, whose
# parsing was a fifth of the client's time per claimed job.
CLAIM = r"""
local owner, lease, m = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local expires = now + lease
local out = {}
for j = 0, m - 1 do
  local t, want, k, cap = ARGV[5 + j * 4], tonumber(ARGV[6 + j * 4]), tonumber(ARGV[7 + j * 4]), ARGV[8 + j * 4]
  local got = 0
  local count_at = #out + 1
  out[count_at] = 0
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
          local f = redis.call('HMGET', key, 'payload', 'max', 'created', 'run', 'attempts', 'token', 'started')
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
          redis.call('ZREM', P .. 'status:pending', id)
          redis.call('ZREM', pending_key, id)
          redis.call('ZADD', P .. 'status:running', 0, id)
          redis.call('ZADD', running_key, 0, id)
          out[#out + 1] = id
          out[#out + 1] = f[1]
          out[#out + 1] = attempts .. ' ' .. f[2] .. ' ' .. token .. ' ' .. f[3] .. ' ' .. f[4] .. ' ' .. (got < k and 1 or 0)
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
"""

# -- settle ------------------------------------------------------------------------------------

# ARGV: prefix, n, then 3 per outcome: id, "token kind delay_ms has_error(1/0)", error.
# In the order given (the same job twice: the second sees what the first wrote). Returns a
# string with a "1" per outcome written, a "0" per stale one (not running, or under another
# token: nothing changed). (Packed: fewer values to encode and parse per outcome.)
SETTLE = r"""
local n = tonumber(ARGV[2])
local now = now_ms()
local out = {}
local wake = false
for i = 0, n - 1 do
  local b = 3 + i * 3
  local id = ARGV[b]
  local token, kind, delay, has_error = string.match(ARGV[b + 1], '^(%S+) (%S+) (%S+) (%S+)$')
  local key = jkey(id)
  local f = redis.call('HMGET', key, 'status', 'token', 'type', 'prio', 'started', 'attempts', 'ukey')
  if f[1] ~= 'running' or f[2] ~= token then
    out[i + 1] = '0'
  else
    out[i + 1] = '1'
    local t, p = f[3], f[4]
    if kind == 'start' then
      if not f[5] then redis.call('HSET', key, 'started', now, 'attempts', tonumber(f[6]) + 1) end
    else
      redis.call('ZREM', P .. 'leases', id)
      redis.call('HDEL', key, 'owner', 'expires')
      if kind == 'succeed' then
        redis.call('HSET', key, 'status', 'completed', 'updated', now)
        index_status(id, t, 'running', 'completed')
        finish(id, 'completed', now)
        free_key(id, t, f[7])
      elseif kind == 'bury' then
        redis.call('HSET', key, 'status', 'dead', 'updated', now)
        if has_error == '1' then redis.call('HSET', key, 'error', ARGV[b + 2]) end
        index_status(id, t, 'running', 'dead')
        finish(id, 'dead', now)
        free_key(id, t, f[7])
      elseif kind == 'retry' then
        local run = now + tonumber(delay)
        redis.call('HSET', key, 'status', 'pending', 'updated', now, 'run', run)
        if has_error == '1' then redis.call('HSET', key, 'error', ARGV[b + 2]) end
        redis.call('HDEL', key, 'started')
        index_status(id, t, 'running', 'pending')
        make_ready(id, t, p, run, now)
      else -- release: due at once, the attempt given back if it was counted
        local attempts = tonumber(f[6])
        if f[5] then attempts = math.max(attempts - 1, 0) end
        redis.call('HSET', key, 'status', 'pending', 'updated', now, 'run', now, 'attempts', attempts)
        redis.call('HDEL', key, 'started')
        index_status(id, t, 'running', 'pending')
        make_ready(id, t, p, now, now)
        wake = true
      end
    end
  end
end
if wake then redis.call('PUBLISH', P .. 'wake', '1') end
return table.concat(out)
"""

# -- leases ------------------------------------------------------------------------------------

# ARGV: prefix, owner, types (JSON), lease_ms, n, then id, token per lease. Records the worker
# as alive; pushes the expiry of the leases still held; returns the ids of the others.
RENEW = r"""
local owner, lease, n = ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
redis.call('HSET', P .. 'workers', owner, now .. '|' .. lease .. '|' .. ARGV[3])
local lost = {}
for i = 0, n - 1 do
  local id, token = ARGV[6 + i * 2], ARGV[7 + i * 2]
  local key = jkey(id)
  local f = redis.call('HMGET', key, 'status', 'token')
  if f[1] == 'running' and f[2] == token then
    redis.call('HSET', key, 'expires', now + lease)
    redis.call('ZADD', P .. 'leases', now + lease, id)
  else
    lost[#lost + 1] = id
  end
end
return lost
"""

FORGET = r"""
redis.call('HDEL', P .. 'workers', ARGV[2])
return 0
"""

# ARGV: prefix, limit. The running jobs whose lease ran out (expiry before now): per job
# id, token, attempts, max, owner, started (1/0). Read only: the rescuer decides, then RESCUE writes.
EXPIRED = r"""
local now = now_ms()
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[2]))) do
  local f = redis.call('HMGET', jkey(id), 'token', 'attempts', 'max', 'owner', 'started', 'status')
  if f[6] == 'running' then
    out[#out + 1] = {id, tonumber(f[1]), tonumber(f[2]), tonumber(f[3]), f[4] or '', f[5] and 1 or 0}
  end
end
return out
"""

# ARGV: prefix, n, then 6 per job: id, token, attempts, started (1/0), dead (1/0), delay_ms,
# error. Each fenced by what EXPIRED read (running, token, attempts, started) and by its lease
# having run out still (a renewal since then keeps it): rescuers running at once move each job
# once. A job that never started goes back in its place with nothing counted. Returns how many moved.
RESCUE = r"""
local n = tonumber(ARGV[2])
local now = now_ms()
local moved = 0
for i = 0, n - 1 do
  local b = 3 + i * 7
  local id, token, attempts, started, dead = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  local key = jkey(id)
  local f = redis.call('HMGET', key, 'status', 'token', 'attempts', 'started', 'expires', 'type', 'prio', 'run', 'ukey')
  if f[1] == 'running' and f[2] == token and f[3] == attempts and ((f[4] and '1' or '0') == started)
     and tonumber(f[5]) < now then
    local t, p = f[6], f[7]
    moved = moved + 1
    redis.call('ZREM', P .. 'leases', id)
    redis.call('HDEL', key, 'owner', 'expires', 'started')
    if started == '0' then
      redis.call('HSET', key, 'status', 'pending', 'updated', now)
      index_status(id, t, 'running', 'pending')
      make_ready(id, t, p, f[8], now)
    elseif dead == '1' then
      redis.call('HSET', key, 'status', 'dead', 'updated', now, 'error', ARGV[b + 6])
      index_status(id, t, 'running', 'dead')
      finish(id, 'dead', now)
      free_key(id, t, f[9])
    else
      local run = now + tonumber(ARGV[b + 5])
      redis.call('HSET', key, 'status', 'pending', 'updated', now, 'run', run, 'error', ARGV[b + 6])
      index_status(id, t, 'running', 'pending')
      make_ready(id, t, p, run, now)
    end
  end
end
return moved
"""

# ARGV: prefix, grace_ms, error text before the type, error text after it, then the known types.
# Pending jobs of a type neither known nor known to a worker alive (beat within the grace, or
# within its own lease), due since before now - grace -> dead. Returns how many.
BURY_UNKNOWN = r"""
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
        free_key(id, t, redis.call('HGET', jkey(id), 'ukey'))
        redis.call('ZREM', ready_key(t, p), id)
        index_status(id, t, 'pending', 'dead')
        finish(id, 'dead', now)
        n = n + 1
      end
      index_head(t, p, now)
    end
  end
end
return n
"""

# -- operators -----------------------------------------------------------------------------------

RECORD_FIELDS = ("type", "payload", "status", "attempts", "max", "run", "error", "created", "updated", "prio", "owner",
                 "expires", "ukey")

# ARGV: prefix, index key, offset, limit, priority ('' for any), order (newest / claim). The
# total of the index and one page of it, newest id first, each job's RECORD_FIELDS after its
# id: one snapshot, so the page and total agree. With a priority or in claim order, the page is
# chosen from every job of the index, read here (no index orders jobs of every status by
# priority): O(jobs of the index), where newest first reads only the page.
LIST = r"""
local key, offset, limit, prio, order = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], ARGV[6]
local page
local out
if prio == '' and order == 'newest' then
  out = {redis.call('ZCARD', key)}
  page = redis.call('ZRANGE', key, '+', '-', 'BYLEX', 'REV', 'LIMIT', offset, limit)
else
  local picked = {}
  for _, id in ipairs(redis.call('ZRANGE', key, 0, -1)) do  -- by id, oldest first
    local f = redis.call('HMGET', jkey(id), 'prio', 'run')
    if prio == '' or f[1] == prio then picked[#picked + 1] = {id, tonumber(f[1]), tonumber(f[2])} end
  end
  if order == 'claim' then
    table.sort(picked, function(a, b)
      if a[2] ~= b[2] then return a[2] < b[2] end
      if a[3] ~= b[3] then return a[3] < b[3] end
      return a[1] < b[1]
    end)
  else
    local n = #picked
    for i = 1, math.floor(n / 2) do picked[i], picked[n + 1 - i] = picked[n + 1 - i], picked[i] end
  end
  out = {#picked}
  page = {}
  for i = offset + 1, math.min(offset + limit, #picked) do page[#page + 1] = picked[i][1] end
end
for _, id in ipairs(page) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HMGET', jkey(id), 'type', 'payload', 'status', 'attempts', 'max', 'run', 'error',
                             'created', 'updated', 'prio', 'owner', 'expires', 'ukey')
end
return out
"""

# ARGV: prefix. now; counts by status; by type (type, then one count per status); finished per
# minute over the last hour (60 completed counts, then 60 dead); the oldest due pending run (or -1).
STATS = r"""
local now = now_ms()
local statuses = {'pending', 'running', 'completed', 'dead'}
local by_status = {}
for i, s in ipairs(statuses) do by_status[i] = redis.call('ZCARD', P .. 'status:' .. s) end
local by_type = {}
for _, t in ipairs(redis.call('SMEMBERS', P .. 'types')) do
  local row = {t}
  for i, s in ipairs(statuses) do row[i + 1] = redis.call('ZCARD', P .. 'st:' .. s .. ':' .. t) end
  by_type[#by_type + 1] = row
end
local last = math.floor(now / 60000) * 60000
local first = last - 59 * 60000
local minutes = {}
for _, s in ipairs({'completed', 'dead'}) do
  for i = 0, 59 do
    local from = first + i * 60000
    minutes[#minutes + 1] = redis.call('ZCOUNT', P .. 'done:' .. s, from, '(' .. (from + 60000))
  end
end
local oldest = -1
for _, t in ipairs(redis.call('SMEMBERS', P .. 'ptypes')) do
  for _, p in ipairs(redis.call('ZRANGE', P .. 'prios:' .. t, 0, -1)) do
    local head = redis.call('ZRANGE', ready_key(t, p), 0, 0, 'WITHSCORES')
    if head[2] then
      local run = tonumber(head[2])
      if run <= now and (oldest < 0 or run < oldest) then oldest = run end
    end
  end
end
return {now, by_status, by_type, minutes, oldest}
"""

# ARGV: prefix, id. dead -> pending, attempts reset, due now. Returns 'ok', 'missing', the
# status, or 'held <id>': its unique key is held by that pending or running job (refused).
REVIVE = r"""
local id = ARGV[2]
local key = jkey(id)
local f = redis.call('HMGET', key, 'status', 'type', 'prio', 'ukey')
if not f[1] then return 'missing' end
if f[1] ~= 'dead' then return f[1] end
if f[4] then
  local holder = key_holder(f[2], f[4])
  if holder then return 'held ' .. holder end
  redis.call('HSET', P .. 'uniq:' .. f[2], f[4], id)
end
local now = now_ms()
redis.call('HSET', key, 'status', 'pending', 'attempts', 0, 'run', now, 'updated', now)
redis.call('HDEL', key, 'started')
redis.call('ZREM', P .. 'done:dead', id)
index_status(id, f[2], 'dead', 'pending')
make_ready(id, f[2], f[3], now, now)
redis.call('PUBLISH', P .. 'wake', '1')
return 'ok'
"""

# ARGV: prefix, id. Returns 'ok', 'missing' or 'running' (refused).
DELETE = r"""
local id = ARGV[2]
local f = redis.call('HMGET', jkey(id), 'status', 'type', 'prio', 'ukey')
if not f[1] then return 'missing' end
if f[1] == 'running' then return 'running' end
remove_job(id, f[1], f[2], f[3], f[4])
return 'ok'
"""

# ARGV: prefix, older_than_ms ('' for any age), limit, then statuses (completed / dead).
# Deletes up to ``limit`` finished jobs (the caller calls again while it gets ``limit``):
# one long script would stop every other client meanwhile.
CLEANUP = r"""
local older, limit = ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local n = 0
for i = 4, #ARGV do
  local s = ARGV[i]
  if n >= limit then break end
  local ids
  if older == '' then
    ids = redis.call('ZRANGE', P .. 'done:' .. s, 0, limit - n - 1)
  else
    ids = redis.call('ZRANGEBYSCORE', P .. 'done:' .. s, '-inf', '(' .. (now - tonumber(older)), 'LIMIT', 0, limit - n)
  end
  for _, id in ipairs(ids) do
    local f = redis.call('HMGET', jkey(id), 'status', 'type', 'prio')
    if f[1] == s then
      remove_job(id, s, f[2], f[3])
    else -- not a job of this status any more (should not happen): drop the stray entry
      redis.call('ZREM', P .. 'done:' .. s, id)
    end
    n = n + 1
  end
end
return n
"""

# -- cron schedules ------------------------------------------------------------------------------

# ARGV: prefix, name, tick, next_run, next_run in ms, now, then one job's 7 fields (as INSERT's).
# Fires a tick: only if the schedule is enabled and its next run is still ``tick``, inserts the job
# and moves the schedule on; returns 1, or 0 with nothing written (another process fired it, or it changed).
SCHEDULE_FIRE = r"""
local key = P .. 'sched:' .. ARGV[2]
local f = redis.call('HMGET', key, 'enabled', 'next')
if f[1] ~= '1' or f[2] ~= ARGV[3] then return 0 end
local n, dup = insert_rows(ARGV, 7, 1, 7)
if not n then return redis.error_reply('DUPLICATE a job with id ' .. dup .. ' already exists') end
redis.call('HSET', key, 'next', ARGV[4], 'last', ARGV[3], 'job', ARGV[7], 'updated', ARGV[6])
redis.call('ZADD', P .. 'scheds:due', ARGV[5], ARGV[2])
return 1
"""

# ARGV: prefix, version. The layout's version, set by the first process to start (SET NX is
# atomic: processes starting at once agree); returns the version stored. A store of layout 1
# (before the claim's index) is upgraded to 2 here, in the same step: its index is built from
# prios:<type> and the ready sets.
SCHEMA = r"""
if redis.call('GET', P .. 'schema') == '1' and ARGV[2] == '2' then
  local now = now_ms()
  for _, t in ipairs(redis.call('SMEMBERS', P .. 'ptypes')) do
    redis.call('DEL', P .. 'pdue:' .. t, P .. 'pwait:' .. t)
    for _, p in ipairs(redis.call('ZRANGE', P .. 'prios:' .. t, 0, -1)) do index_head(t, p, now) end
  end
  redis.call('SET', P .. 'schema', '2')
end
redis.call('SET', P .. 'schema', ARGV[2], 'NX')
return redis.call('GET', P .. 'schema')
"""


@attrs.frozen
class Script:
    name: str
    source: str
    sha: str

    @classmethod
    def of(cls, name: str, body: str) -> Script:
        source = _PRELUDE + body
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())


ALL: dict[str, Script] = {
    name: Script.of(name, body)
    for name, body in {
        "insert": INSERT, "insert_unique": INSERT_UNIQUE, "insert_staged": INSERT_STAGED, "claim": CLAIM, "settle": SETTLE, "renew": RENEW,
        "forget": FORGET, "expired": EXPIRED, "rescue": RESCUE, "bury_unknown": BURY_UNKNOWN, "list": LIST,
        "stats": STATS, "revive": REVIVE, "delete": DELETE, "cleanup": CLEANUP, "schema": SCHEMA,
        "schedule_fire": SCHEDULE_FIRE,
    }.items()
}
