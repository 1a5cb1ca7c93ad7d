-- ARGV: prefix, id. Per parent of the job still stored, in ``after`` order: its id, its job type and
-- its result (nil for none: a result is kept only while the job is completed).
local out = {}
for _, p in ipairs(redis.call('ZRANGE', P .. 'after:' .. ARGV[2], 0, -1)) do
  local f = redis.call('HMGET', jkey(p), 'status', 'result', 'type')
  if f[1] then
    out[#out + 1] = p
    out[#out + 1] = f[3]
    out[#out + 1] = f[2] or false
  end
end
return out
