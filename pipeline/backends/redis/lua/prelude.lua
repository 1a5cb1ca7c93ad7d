-- Functions every script shares: prepended to each (a Redis script cannot import).
local P = ARGV[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor((tonumber(t[2]) + 500) / 1000)
end
local function jkey(id) return P .. 'job:' .. id end
local function ready_key(t, p) return P .. 'ready:' .. t .. ':' .. p end
-- A job's status is in st:<status>:<type>; the statuses every job passes through (HOT) have no
-- set across types besides (layout 7): a job's way through them is 8 sorted-set commands, not 12.
-- A list or count of one of them across types reads each type's set (list.lua, stats.lua).
local HOT = {pending = true, running = true, completed = true}
local function index_status(id, t, from, to)
  if from then
    if not HOT[from] then redis.call('ZREM', P .. 'status:' .. from, id) end
    redis.call('ZREM', P .. 'st:' .. from .. ':' .. t, id)
  end
  if to then
    if not HOT[to] then redis.call('ZADD', P .. 'status:' .. to, 0, id) end
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
-- the waiting, pending, running or suspended job holding a type's unique key, or nil
local function key_holder(t, k)
  local holder = redis.call('HGET', P .. 'uniq:' .. t, k)
  if not holder then return nil end
  local status = redis.call('HGET', jkey(holder), 'status')
  if status == 'pending' or status == 'running' or status == 'waiting' or status == 'suspended' then return holder end
  return nil  -- (a stale entry: its job left those statuses without freeing it)
end
-- a job that leaves waiting, pending, running and suspended for good frees its unique key (k: its ukey field, or nil)
local function free_key(id, t, k)
  if k and redis.call('HGET', P .. 'uniq:' .. t, k) == id then redis.call('HDEL', P .. 'uniq:' .. t, k) end
end
-- Per-key limits (issue 23). A pending job with a limit key (field lkey) is in none of the sets
-- above (ready:<t>:<p>, prios, pdue, pwait, ptypes) but in these, so that a claim of a key-limited
-- type visits keys, not jobs:
--   kpend:<t>             ZSET every pending keyed job of type t, score = run (what stats and
--                              bury_unknown read)
--   kwait:<t>             ZSET those not due when they became pending, until a claim moves them
--   kready:<n>:<t>:<key>  ZSET the others, of one key (n: the length of t, so that no type and key
--                              make the name of another pair): score = priority, member = kmember:
--                              run then id, so the members sort in claim order
--   kheads:<t>            ZSET each key's first job in kready (score and member as there): the
--                              keys in the claim order of their first due job
--   ktypes                SET  the types that have a kpend set
-- A running keyed job is in krun:<n>:<t>:<key> (SET of ids): what a key's limit counts.
local function kname(kind, t, k) return P .. kind .. ':' .. #t .. ':' .. t .. ':' .. k end
local function kmember(run, id) return string.format('%016.0f', tonumber(run) + 1e15) .. id end
local function kready_add(t, k, p, m)
  local rk = kname('kready', t, k)
  redis.call('ZADD', rk, p, m)
  local h = redis.call('ZRANGE', rk, 0, 1)
  if h[1] == m then  -- the key's new first job
    local heads = P .. 'kheads:' .. t
    if h[2] then redis.call('ZREM', heads, h[2]) end
    redis.call('ZADD', heads, p, m)
  end
end
local function kready_rem(t, k, m)
  local rk = kname('kready', t, k)
  local h = redis.call('ZRANGE', rk, 0, 1, 'WITHSCORES')
  redis.call('ZREM', rk, m)
  if h[1] == m then
    local heads = P .. 'kheads:' .. t
    redis.call('ZREM', heads, m)
    if h[3] then redis.call('ZADD', heads, h[4], h[3]) end
  end
end
local function keyed_add(id, t, p, run, k, now)
  redis.call('ZADD', P .. 'kpend:' .. t, run, id)
  redis.call('SADD', P .. 'ktypes', t)
  if tonumber(run) <= now then
    kready_add(t, k, p, kmember(run, id))
  else
    redis.call('ZADD', P .. 'kwait:' .. t, run, id)
  end
end
local function keyed_rem(id, t, run, k)
  local pk = P .. 'kpend:' .. t
  redis.call('ZREM', pk, id)
  if redis.call('ZREM', P .. 'kwait:' .. t, id) == 0 then kready_rem(t, k, kmember(run, id)) end
  if redis.call('EXISTS', pk) == 0 then redis.call('SREM', P .. 'ktypes', t) end
end
-- a job goes (back) to pending, due at ``run``: its ready set, or its key's sets (k: its lkey field)
local function to_pending(id, t, p, run, k, now)
  if k then keyed_add(id, t, p, run, k, now) else make_ready(id, t, p, run, now) end
end
-- a running job leaves running: out of its key's running set (k: its lkey field, or nil)
local function off_running(id, t, k)
  if k then redis.call('SREM', kname('krun', t, k), id) end
end
-- A job of unique_while "pending" (field uwhile) holds its unique key only while pending: the
-- claim frees it (free_key); back to pending it holds it again, unless another pending or running
-- job took it meanwhile (then it goes on without: never an error).
local function hold_again(id, t, k)
  if not key_holder(t, k) then redis.call('HSET', P .. 'uniq:' .. t, k, id) end
end
-- Control (issue 23). expiring:<t> holds the pending jobs of type t that have an expires_at
-- (field expat), by that time (ms); etypes the types that have such a set. A job is in it exactly
-- while it is pending: a claim takes it out, a way back to pending puts it in again.
local function expiring_add(id, t, at)
  redis.call('ZADD', P .. 'expiring:' .. t, at, id)
  redis.call('SADD', P .. 'etypes', t)
end
local function expiring_rem(id, t)
  local k = P .. 'expiring:' .. t
  redis.call('ZREM', k, id)
  if redis.call('EXISTS', k) == 0 then redis.call('SREM', P .. 'etypes', t) end
end
-- epoch ms as the protocol's text (store.text_of's): a script cannot call os.date
local function iso(ms)
  local s = math.floor(ms / 1000)
  local days = math.floor(s / 86400)
  local secs = s - days * 86400
  -- days since 1970-01-01 to a civil date (Howard Hinnant's civil_from_days)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400 + (m <= 2 and 1 or 0)
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03dZ', y, m, d, math.floor(secs / 3600),
                       math.floor(secs % 3600 / 60), secs % 60, ms - s * 1000)
end
-- Workflows (issue 24). A job enqueued with parents (NewJob.after) has the fields wfor (how many
-- of its edges have not counted yet) and opf ('1': on_parent_failure "run"), and
--   after:<id>     ZSET its parents, score = their place in ``after`` (0, 1, ...)
-- A job that has children has the field kids ('1'), and
--   children:<id>  ZSET its children, score = their created (ms): oldest first
--   down:<id>      SET  those of them whose edge from it has not counted yet
-- A member or callback of a batch has the field batch; a batch is batch:<id> (HASH: cb, created)
-- and bjobs:<id> (ZSET of its members, score = their place in the insert). A waiting job is in no
-- ready set: only in status:waiting and st:waiting:<type> (and holds its unique key).
-- Every script that ends a job (completed, dead, cancelled, or deleted while it had not ended)
-- calls release_children for a job with kids, in the same script; a plain job pays the HMGET
-- field kids, nothing more. WF.woke: a job made due by a WAKE (the script PUBLISHes wake); WF.ids:
-- those jobs (settle.lua's quiet mode answers them instead of PUBLISHing).
local WF = {woke = false, ids = {}}
local function parent_failed(pid, how)  -- base.parent_failed's text
  if how == 'deleted' then return 'cancelled while waiting: its parent job ' .. pid .. ' was deleted' end
  return 'cancelled while waiting: its parent job ' .. pid .. ' ended ' .. how
end
local function is_final(status) return status == 'completed' or status == 'dead' or status == 'cancelled' end
-- WAKE: a waiting job becomes pending, due at its own run (at once if that passed): its ready set
-- (or its key's sets) and the claim's index, expiring:<t> if it has an expires_at
local function wake(id, key, now)
  local f = redis.call('HMGET', key, 'type', 'prio', 'run', 'lkey', 'expat')
  redis.call('HSET', key, 'status', 'pending', 'updated', now)
  index_status(id, f[1], 'waiting', 'pending')
  to_pending(id, f[1], f[2], f[3], f[4], now)
  redis.call('SADD', P .. 'types', f[1])
  if f[5] then expiring_add(id, f[1], f[5]) end
  if tonumber(f[3]) <= now then
    WF.woke = true
    WF.ids[#WF.ids + 1] = id
  end
end
-- CANCEL_WAITING (or an operator's cancel of a waiting job): final, its unique key freed
local function cancel_waiting(id, key, t, k, err, now)
  redis.call('HSET', key, 'status', 'cancelled', 'updated', now, 'error', err)
  index_status(id, t, 'waiting', 'cancelled')
  finish(id, 'cancelled', now)
  free_key(id, t, k)
end
-- The edges of job ``id`` that have not counted yet count now: it ended ``how`` ('completed',
-- 'dead', 'cancelled' or 'deleted'). Per child: wfor - 1; a waiting child whose parent completed
-- (or that runs whatever its parents do, opf) wakes at 0; under the default a parent that did not
-- complete cancels a waiting child, whose own edges then count the same way: a queue, not
-- recursion, however deep the graph. A child no longer waiting only has its count moved.
-- Returns how many jobs it woke or cancelled.
local function release_children(id, how, now)
  local queue, head, moved = {id, how}, 1, 0
  while queue[head] do
    local pid, phow = queue[head], queue[head + 1]
    head = head + 2
    local dk = P .. 'down:' .. pid
    local kids = redis.call('SMEMBERS', dk)
    if #kids > 0 then redis.call('DEL', dk) end
    for _, c in ipairs(kids) do
      local ck = jkey(c)
      local f = redis.call('HMGET', ck, 'status', 'wfor', 'opf', 'type', 'ukey', 'kids')
      if f[1] then
        local left = math.max(tonumber(f[2] or '1') - 1, 0)
        redis.call('HSET', ck, 'wfor', left)
        if f[1] == 'waiting' then
          if phow == 'completed' or f[3] then
            if left == 0 then
              wake(c, ck, now)
              moved = moved + 1
            end
          else
            cancel_waiting(c, ck, f[4], f[5], parent_failed(pid, phow), now)
            moved = moved + 1
            if f[6] then
              queue[#queue + 1] = c
              queue[#queue + 1] = 'cancelled'
            end
          end
        end
      end
    end
  end
  return moved
end
local function publish_woken()
  if WF.woke then
    redis.call('PUBLISH', P .. 'wake', '1')
    WF.woke = false
  end
end
-- A job's workflow keys go with it (delete, cleanup, retention): as a child, its entries in its
-- parents' children and down sets (a parent left without children loses its kids flag); as a
-- parent, its entry in its children's after sets; as a batch's job, its entry in bjobs:<batch>,
-- and the batch record once none of its jobs is left. (has_parents: its wfor field, kids, batch: its fields.)
local function drop_edges(id, has_parents, kids, batch)
  if has_parents then
    local ak = P .. 'after:' .. id
    for _, p in ipairs(redis.call('ZRANGE', ak, 0, -1)) do
      redis.call('SREM', P .. 'down:' .. p, id)
      local ck = P .. 'children:' .. p
      redis.call('ZREM', ck, id)
      if redis.call('EXISTS', ck) == 0 then redis.call('HDEL', jkey(p), 'kids') end
    end
    redis.call('DEL', ak)
  end
  if kids then
    local ck = P .. 'children:' .. id
    for _, c in ipairs(redis.call('ZRANGE', ck, 0, -1)) do redis.call('ZREM', P .. 'after:' .. c, id) end
    redis.call('DEL', ck, P .. 'down:' .. id)
  end
  if batch then
    local members = P .. 'bjobs:' .. batch
    redis.call('ZREM', members, id)
    if redis.call('EXISTS', members) == 0 then
      local bk = P .. 'batch:' .. batch
      local cb = redis.call('HGET', bk, 'cb')
      if not cb or cb == id or redis.call('EXISTS', jkey(cb)) == 0 then redis.call('DEL', bk) end
    end
  end
end
-- The workflow part of an insert's arguments, from ``at`` in ``list``: m (nil: every entry to the
-- end of the list, as a bulk load stages them), then per job that has parents or a batch: id, '1'
-- for on_parent_failure "run" ('' for the default), batch id ('' for none), the number of parents
-- and their ids in ``after`` order; then the batch record of the call, if any: id, callback id (''
-- for none), created (ms).
local function read_flow(list, at, counted)
  local flow = {rows = {}}
  local m = math.huge
  if counted then
    m = tonumber(list[at])
    at = at + 1
  end
  while m > 0 and list[at + 3] do
    local k = tonumber(list[at + 3])
    local row = {run = list[at + 1] == '1', batch = list[at + 2] ~= '' and list[at + 2] or nil, after = {}}
    for j = 1, k do row.after[j] = list[at + 3 + j] end
    flow.rows[list[at]] = row
    at = at + 4 + k
    m = m - 1
  end
  if counted and list[at] then
    flow.batch = {id = list[at], cb = list[at + 1] ~= '' and list[at + 1] or nil, created = list[at + 2]}
  end
  return flow
end
-- a pending job (its ready set and expiring:<t> already left) ends cancelled with ``err``, and
-- applies its edges (kids: its kids field)
local function cancel_pending(id, key, t, k, err, now, kids)
  redis.call('HSET', key, 'status', 'cancelled', 'updated', now, 'error', err)
  index_status(id, t, 'pending', 'cancelled')
  finish(id, 'cancelled', now)
  free_key(id, t, k)
  if kids then release_children(id, 'cancelled', now) end
end
-- The pending jobs of type t whose expires_at is at or before now end cancelled (base.expired_error's
-- text): the claim's, before it claims t, and the rescue's. Returns how many.
local function expire_due(t, now)
  local k = P .. 'expiring:' .. t
  local ids = redis.call('ZRANGEBYSCORE', k, '-inf', now)
  if #ids == 0 then return 0 end
  local touched = {}
  local n = 0
  repeat  -- (again while the edges of those it ended woke jobs of t that expired already)
    for i = 1, #ids, 1000 do redis.call('ZREM', k, unpack(ids, i, math.min(i + 999, #ids))) end
    for _, id in ipairs(ids) do
      local key = jkey(id)
      local f = redis.call('HMGET', key, 'status', 'prio', 'expat', 'ukey', 'lkey', 'run', 'kids')
      if f[1] == 'pending' then  -- (else a stray entry: dropped above)
        if f[5] then
          keyed_rem(id, t, f[6], f[5])
        else
          redis.call('ZREM', ready_key(t, f[2]), id)
          touched[f[2]] = true
        end
        cancel_pending(id, key, t, f[4], 'expired at ' .. iso(tonumber(f[3])) .. ' before it (or its next attempt) started',
                       now, f[7])
        n = n + 1
      end
    end
    ids = redis.call('ZRANGEBYSCORE', k, '-inf', now)
  until #ids == 0
  if redis.call('EXISTS', k) == 0 then redis.call('SREM', P .. 'etypes', t) end
  for p in pairs(touched) do index_head(t, p, now) end
  return n
end
-- A running job whose cancel was requested (field creq) is in creq:<owner>, its lease owner's
-- index (Backend.cancel_requests); one that leaves running drops it, before its owner field goes.
local function drop_request(id, key)
  local owner = redis.call('HGET', key, 'owner')
  if owner then redis.call('SREM', P .. 'creq:' .. owner, id) end
  redis.call('HDEL', key, 'creq')
end
-- rows: a flat list, ``width`` per job from ``first``: 7 (id, type, payload, max, run, prio,
-- created), or 12 with the unique key, the trace context, expires_at in ms, the limit key and
-- unique_while ('' for none; '1' for "pending"). flow (read_flow's, or nil): the jobs' parents,
-- on_parent_failure and batch, and the call's batch record.
-- Returns how many were inserted and, for each row not inserted because a waiting, pending or
-- running job holds its type and key (or an earlier row of the call), its id and the holder's;
-- or nil and the error (nothing written): 'DUPLICATE ...' (an id, or the batch's, that exists
-- already) or 'UNKNOWN <JSON list>' (parents neither stored nor earlier in the call).
-- A job with parents is inserted waiting while an edge waits (its parent not ended), cancelled
-- (finished now, error parent_failed, holding no key) when a parent that ended dead or cancelled
-- cancels it (the default), else pending; a parent earlier in the call is seen as inserted.
local function insert_rows(rows, first, n, width, flow)
  local seen = {}
  local held = {}  -- row index -> holder id
  local taken = {}  -- type NUL key -> id, for the keys this call takes
  local dups = {}
  local state = {}  -- id -> status of each row to be inserted, when the call has a workflow part
  local missing = {}
  for i = 0, n - 1 do
    local b = first + i * width
    local id = rows[b]
    if seen[id] or redis.call('EXISTS', jkey(id)) == 1 then
      return nil, 'DUPLICATE a job with id ' .. id .. ' already exists'
    end
    seen[id] = true
    local k = width == 12 and rows[b + 7] or ''
    local tk
    if k ~= '' then
      tk = rows[b + 1] .. '\0' .. k
      local holder = taken[tk] or key_holder(rows[b + 1], k)
      if holder then
        held[i] = holder
        dups[#dups + 1] = id
        dups[#dups + 1] = holder
      end
    end
    if flow and not held[i] then
      local wf = flow.rows[id]
      local status = 'pending'
      if wf and #wf.after > 0 then
        local waits = {}
        for _, p in ipairs(wf.after) do
          local ps = state[p] or redis.call('HGET', jkey(p), 'status')
          if not ps then
            missing[#missing + 1] = p
          elseif ps == 'dead' or ps == 'cancelled' then
            if not wf.run and not wf.failed then wf.failed = parent_failed(p, ps) end
          elseif ps ~= 'completed' then
            waits[#waits + 1] = p
          end
        end
        wf.waits = waits
        status = wf.failed and 'cancelled' or (#waits > 0 and 'waiting' or 'pending')
      end
      state[id] = status
      if tk and status ~= 'cancelled' then taken[tk] = id end
    elseif tk and not held[i] then
      taken[tk] = id
    end
  end
  if #missing > 0 then return nil, 'UNKNOWN ' .. cjson.encode(missing) end
  if flow and flow.batch and redis.call('EXISTS', P .. 'batch:' .. flow.batch.id) == 1 then
    return nil, 'DUPLICATE a batch with id ' .. flow.batch.id .. ' already exists'
  end
  local now = now_ms()
  local due = false
  local known = {}  -- (type, priority) whose sets this call wrote already -> the earliest run given
  local flagged = {}  -- parents given the kids flag by this call
  local member = 0
  local inserted = 0
  for i = 0, n - 1 do
    local b = first + i * width
    local id, t, p, run = rows[b], rows[b + 1], rows[b + 5], rows[b + 4]
    local k = width == 12 and rows[b + 7] or ''
    local lk = width == 12 and rows[b + 10] or ''
    if not held[i] then
      inserted = inserted + 1
      local key = jkey(id)
      local status = state[id] or 'pending'
      redis.call('HSET', key, 'type', t, 'payload', rows[b + 2], 'status', status, 'attempts', 0,
                 'max', rows[b + 3], 'run', run, 'prio', p, 'created', rows[b + 6], 'updated', rows[b + 6], 'token', 0)
      if k ~= '' then
        redis.call('HSET', key, 'ukey', k)
        if status ~= 'cancelled' then redis.call('HSET', P .. 'uniq:' .. t, k, id) end
      end
      if width == 12 then
        if rows[b + 8] ~= '' then redis.call('HSET', key, 'trace', rows[b + 8]) end
        if rows[b + 9] ~= '' then
          redis.call('HSET', key, 'expat', rows[b + 9])
          if status == 'pending' then expiring_add(id, t, rows[b + 9]) end
        end
        if rows[b + 11] ~= '' then redis.call('HSET', key, 'uwhile', '1') end
      end
      local wf = flow and flow.rows[id]
      if wf then
        if #wf.after > 0 then
          local ak = P .. 'after:' .. id
          for j, parent in ipairs(wf.after) do
            redis.call('ZADD', ak, j - 1, parent)
            redis.call('ZADD', P .. 'children:' .. parent, rows[b + 6], id)
            if not flagged[parent] then
              redis.call('HSET', jkey(parent), 'kids', '1')
              flagged[parent] = true
            end
          end
          for _, parent in ipairs(wf.waits) do redis.call('SADD', P .. 'down:' .. parent, id) end
          redis.call('HSET', key, 'wfor', #wf.waits)
          if wf.run then redis.call('HSET', key, 'opf', '1') end
        end
        if wf.batch then
          redis.call('HSET', key, 'batch', wf.batch)
          if flow.batch and wf.batch == flow.batch.id and id ~= flow.batch.cb then
            redis.call('ZADD', P .. 'bjobs:' .. wf.batch, member, id)
            member = member + 1
          end
        end
      end
      local tp = t .. '\0' .. p
      if status ~= 'pending' then
        if lk ~= '' then redis.call('HSET', key, 'lkey', lk) end
        redis.call('SADD', P .. 'types', t)
        if status == 'cancelled' then
          redis.call('HSET', key, 'updated', now, 'error', wf.failed)
          finish(id, 'cancelled', now)
        end
      elseif lk ~= '' then
        redis.call('HSET', key, 'lkey', lk)
        keyed_add(id, t, p, run, lk, now)
        redis.call('SADD', P .. 'types', t)
      elseif known[tp] then
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
      index_status(id, t, nil, status)
      if status == 'pending' and tonumber(run) <= now then due = true end
    end
  end
  if flow and flow.batch then
    local bk = P .. 'batch:' .. flow.batch.id
    redis.call('HSET', bk, 'created', flow.batch.created)
    if flow.batch.cb then redis.call('HSET', bk, 'cb', flow.batch.cb) end
  end
  if due then redis.call('PUBLISH', P .. 'wake', '1') end
  return inserted, nil, dups
end
-- (lk, run: a pending job's lkey and run fields; has_parents, kids, batch: its wfor, kids and batch
-- fields). A job that had not ended (pending, waiting, suspended) applies its edges as "deleted" first;
-- its steps and signals (steps:<id>, sig:<id>) go with it.
local function remove_job(id, f_status, t, p, k, e, lk, run, has_parents, kids, batch)
  if f_status == 'pending' then
    if lk then keyed_rem(id, t, run, lk) else unready(id, t, p) end
    if e then expiring_rem(id, t) end
  end
  if f_status == 'suspended' then redis.call('ZREM', P .. 'suspended', id) end
  if f_status == 'pending' or f_status == 'running' or f_status == 'waiting' or f_status == 'suspended' then
    free_key(id, t, k)
  end
  if kids then release_children(id, is_final(f_status) and f_status or 'deleted', now_ms()) end
  if has_parents or kids or batch then drop_edges(id, has_parents, kids, batch) end
  redis.call('ZREM', P .. 'done:' .. f_status, id)
  index_status(id, t, f_status, nil)
  redis.call('ZREM', P .. 'all', id)
  redis.call('ZREM', P .. 'type:' .. t, id)
  redis.call('DEL', jkey(id), P .. 'steps:' .. id, P .. 'sig:' .. id)  -- (its steps and signals go with it)
  if redis.call('EXISTS', P .. 'type:' .. t) == 0 then redis.call('SREM', P .. 'types', t) end
end
-- Durable functions (issue 35). A job's steps are steps:<id> (HASH: step name -> "<n> <body>", n its
-- place in the order first written: a new name takes HLEN + 1, a name written again keeps its n; a
-- replay removes a name and every later one, so the places stay 1..HLEN. body: status NUL started NUL
-- ended ('' for none) NUL, then 'v' and the value's JSON text, or nothing for none). Its signals are
-- sig:<id> (HASH: per signal name, 't:<name>' how many were sent, 'h:<name>' how many were consumed,
-- 'e:<i>:<name>' the i-th one's payload until it is consumed ('v' then its JSON text, '' for none):
-- consumed oldest first per name, each O(1); 'k:<key>' for each signal key used). Both go with their
-- job (remove_job). A suspended job is in none of the pending sets, but in suspended (ZSET, score: when
-- it is due, ms; FOREVER_MS when it has no deadline), in status:suspended and st:suspended:<t>, and has
-- the field await while a ctx.wait_for waits (the signal's name). It keeps holding its unique key.
local FOREVER_MS = 253402300799999  -- base.FOREVER, 9999-12-31T23:59:59.999Z
local function put_step(id, name, body)  -- upsert by name, keeping its place
  local sk = P .. 'steps:' .. id
  local old = redis.call('HGET', sk, name)
  local n = old and string.match(old, '^(%d+) ') or (redis.call('HLEN', sk) + 1)
  redis.call('HSET', sk, name, n .. ' ' .. body)
end
-- the place (i) of the oldest signal named ``name`` that job id has not consumed, or nil
local function signal_kept(id, name)
  local f = redis.call('HMGET', P .. 'sig:' .. id, 'h:' .. name, 't:' .. name)
  local h = tonumber(f[1] or '0')
  if h < tonumber(f[2] or '0') then return h + 1 end
  return nil
end
-- RESUME: a suspended job becomes pending due at ``run`` (its ready set or its key's sets), its
-- await field cleared (the caller PUBLISHes wake)
local function resume(id, key, run, now)
  local f = redis.call('HMGET', key, 'type', 'prio', 'lkey')
  redis.call('ZREM', P .. 'suspended', id)
  redis.call('HSET', key, 'status', 'pending', 'updated', now, 'run', run)
  redis.call('HDEL', key, 'await')
  index_status(id, f[1], 'suspended', 'pending')
  to_pending(id, f[1], f[2], run, f[3], now)
end
-- settle's STEP and SUSPEND carry, in the place of an outcome's error: "<a> <n> " (the byte lengths of
-- the awaited signal's name and of the step's name, '-' for none), that name, the step's name, then
-- the step's body (see put_step). Returns the awaited name (or nil), the step's name (or nil), its body.
local function durable_part(s)
  local a, n, at = string.match(s, '^([%d-]+) ([%d-]+) ()')
  local awaiting, name
  if a ~= '-' then
    awaiting = string.sub(s, at, at + tonumber(a) - 1)
    at = at + tonumber(a)
  end
  if n ~= '-' then
    name = string.sub(s, at, at + tonumber(n) - 1)
    at = at + tonumber(n)
  end
  return awaiting, name, string.sub(s, at)
end
