-- ARGV: prefix, age in ms. Removes the entries of ``workers`` whose lease ran out more than that
-- long ago by the server's clock; returns how many.
local cutoff = now_ms() - tonumber(ARGV[2])
local entries = redis.call('HGETALL', P .. 'workers')
local n = 0
for i = 1, #entries, 2 do
  local beat, lease = string.match(entries[i + 1], '^(%d+)|(%d+)|')
  if beat and tonumber(beat) + tonumber(lease) < cutoff then
    redis.call('HDEL', P .. 'workers', entries[i])
    n = n + 1
  end
end
return n
