-- ARGV: prefix, batch id. Nil for an unknown batch; else its callback's id ('' for none), created
-- (ms), its members' count, then per status that occurs among them the status and its count, and
-- the callback's status ('' for none, or gone). One snapshot; reads each member's status.
local bk = P .. 'batch:' .. ARGV[2]
local f = redis.call('HMGET', bk, 'created', 'cb')
if not f[1] then return nil end
local counts, order = {}, {}
local members = redis.call('ZRANGE', P .. 'bjobs:' .. ARGV[2], 0, -1)
for _, id in ipairs(members) do
  local s = redis.call('HGET', jkey(id), 'status')
  if s then
    if not counts[s] then
      counts[s] = 0
      order[#order + 1] = s
    end
    counts[s] = counts[s] + 1
  end
end
local flat = {}
for _, s in ipairs(order) do
  flat[#flat + 1] = s
  flat[#flat + 1] = counts[s]
end
local cb_status = f[2] and redis.call('HGET', jkey(f[2]), 'status')
return {f[2] or '', f[1], #members, flat, cb_status or ''}
