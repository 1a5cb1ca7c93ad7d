-- ARGV: prefix, version. The layout's version, set by the first process to start (SET NX is
-- atomic: processes starting at once agree); returns the version stored. A store of layout 1
-- (before the claim's index) is upgraded to 2 here, in the same step: its index is built from
-- prios:<type> and the ready sets.
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
