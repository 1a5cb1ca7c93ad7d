-- ARGV: prefix, batch id, offset, limit (-1: all). The batch's members in the order they were
-- inserted, each id, then its type, status, result and error (nil for none).
local members = redis.call('ZRANGE', P .. 'bjobs:' .. ARGV[2], tonumber(ARGV[3]),
                           tonumber(ARGV[4]) < 0 and -1 or tonumber(ARGV[3]) + tonumber(ARGV[4]) - 1)
local out = {}
for _, id in ipairs(members) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HMGET', jkey(id), 'type', 'status', 'result', 'error')
end
return out
