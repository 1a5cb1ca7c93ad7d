-- ARGV: prefix. now; counts by status; by type (type, then one count per status); finished per
-- minute over the last hour (60 completed counts, then 60 dead, then 60 cancelled); the oldest due
-- pending run (or -1).
local now = now_ms()
local statuses = {'waiting', 'pending', 'running', 'completed', 'dead', 'cancelled', 'suspended'}
local by_status = {0, 0, 0, 0, 0, 0, 0}  -- the sums of the types' counts (no status:<s> of a HOT one)
local by_type = {}
for _, t in ipairs(redis.call('SMEMBERS', P .. 'types')) do
  local row = {t}
  for i, s in ipairs(statuses) do
    row[i + 1] = redis.call('ZCARD', P .. 'st:' .. s .. ':' .. t)
    by_status[i] = by_status[i] + row[i + 1]
  end
  by_type[#by_type + 1] = row
end
local last = math.floor(now / 60000) * 60000
local first = last - 59 * 60000
local minutes = {}
for _, s in ipairs({'completed', 'dead', 'cancelled'}) do
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
for _, t in ipairs(redis.call('SMEMBERS', P .. 'ktypes')) do  -- keyed pending jobs: kpend:<type>, by run
  local head = redis.call('ZRANGE', P .. 'kpend:' .. t, 0, 0, 'WITHSCORES')
  if head[2] then
    local run = tonumber(head[2])
    if run <= now and (oldest < 0 or run < oldest) then oldest = run end
  end
end
return {now, by_status, by_type, minutes, oldest}
