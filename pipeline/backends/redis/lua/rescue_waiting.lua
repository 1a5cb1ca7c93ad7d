-- ARGV: prefix, limit, visits. The repair sweep (Backend.rescue_waiting): visits up to ``visits``
-- waiting jobs (status:waiting, by id), from where the last sweep stopped (wsweep: the last id
-- visited; from the first again once the end is reached). Per job, each parent whose edge has not
-- counted (the job in down:<parent>) although the parent ended, or is gone: that parent's edges
-- are applied now (release_children, a gone parent as "deleted", its keys then dropped as its
-- delete drops them); then a job still waiting has
-- its count set to the edges still waiting, and is woken at 0. Stops once ``limit`` parents were
-- applied. Returns how many jobs it woke or cancelled. With no waiting job: one GET and one ZRANGE.
local limit, visits = tonumber(ARGV[2]), tonumber(ARGV[3])
local cursor = P .. 'wsweep'
local from = redis.call('GET', cursor)
local ids = redis.call('ZRANGE', P .. 'status:waiting', from and ('(' .. from) or '-', '+', 'BYLEX', 'LIMIT', 0, visits)
if #ids < visits then
  if from then redis.call('DEL', cursor) end
else
  redis.call('SET', cursor, ids[#ids])
end
if #ids == 0 then return 0 end
local now = now_ms()
local moved, applied = 0, 0
for _, c in ipairs(ids) do
  local ck = jkey(c)
  if redis.call('HGET', ck, 'status') == 'waiting' then
    local waits = 0
    for _, p in ipairs(redis.call('ZRANGE', P .. 'after:' .. c, 0, -1)) do
      if redis.call('SISMEMBER', P .. 'down:' .. p, c) == 1 then
        local ps = redis.call('HGET', jkey(p), 'status')
        if not ps or is_final(ps) then
          moved = moved + release_children(p, ps or 'deleted', now)
          if not ps then drop_edges(p, false, true, nil) end  -- (its keys, as its delete drops them)
          applied = applied + 1
        else
          waits = waits + 1
        end
      end
    end
    local f = redis.call('HMGET', ck, 'status', 'wfor')
    if f[1] == 'waiting' then
      if tonumber(f[2] or '0') ~= waits then redis.call('HSET', ck, 'wfor', waits) end
      if waits == 0 then
        wake(c, ck, now)
        moved = moved + 1
      end
    end
  end
  if applied >= limit then
    redis.call('SET', cursor, c)
    break
  end
end
publish_woken()
return moved
