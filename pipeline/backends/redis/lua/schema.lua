-- ARGV: prefix, version. The layout's version, set by the first process to start (SET NX is
-- atomic: processes starting at once agree); returns the version stored. An older layout is
-- upgraded here, in the same step: 1 (before the claim's index) has its index built from
-- prios:<type> and the ready sets; 2 (before issue 23's control: cancelled jobs, expires_at,
-- paused types, cancel requests), 3 (before its limits: keyed jobs' sets, rate logs, keys held
-- while pending) and 4 (before issue 24's workflows: waiting jobs, edges, batches) need nothing,
-- their keys start empty; so does 5 (before issue 35's durable functions: suspended jobs, steps,
-- signals). The version moves on so that a process of older code refuses it: code
-- of layout 2 would claim a paused type's jobs and expired ones; code of layout 3 would put a keyed
-- job back in a ready set (a retry, a rescue), never take it out of its key's running set (the key
-- full for ever), and keep a key held while pending held while its job runs; code of layout 4
-- would end a parent without applying its edges (its waiting children stuck until a sweep), insert
-- a job over a waiting job's unique key, and delete a waiting job's keys without its edges; code of
-- layout 5 would insert a job over a suspended job's unique key, delete a suspended job leaving it in
-- the suspended set and its steps and signals behind, and count no suspended job. 6 (before issue 36:
-- status:<s> sets across types for every status) loses status:pending, status:running and
-- status:completed (UNLINK: freed off the main thread, a million members or not); code of layout 6
-- would list and count those statuses from sets no longer kept.
local stored = redis.call('GET', P .. 'schema')
if (stored == '1' or stored == '2' or stored == '3' or stored == '4' or stored == '5' or stored == '6')
    and tonumber(ARGV[2]) > tonumber(stored) then
  redis.call('UNLINK', P .. 'status:pending', P .. 'status:running', P .. 'status:completed')
  if stored == '1' then
    local now = now_ms()
    for _, t in ipairs(redis.call('SMEMBERS', P .. 'ptypes')) do
      redis.call('DEL', P .. 'pdue:' .. t, P .. 'pwait:' .. t)
      for _, p in ipairs(redis.call('ZRANGE', P .. 'prios:' .. t, 0, -1)) do index_head(t, p, now) end
    end
  end
  redis.call('SET', P .. 'schema', ARGV[2])
end
redis.call('SET', P .. 'schema', ARGV[2], 'NX')
return redis.call('GET', P .. 'schema')
