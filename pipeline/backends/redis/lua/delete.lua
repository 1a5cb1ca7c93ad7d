-- ARGV: prefix, id. Returns 'ok', 'missing' or 'running' (refused). A pending, waiting or suspended
-- job applies its edges as "deleted"; its workflow keys, steps and signals go with it (remove_job).
local id = ARGV[2]
local f = redis.call('HMGET', jkey(id), 'status', 'type', 'prio', 'ukey', 'expat', 'lkey', 'run', 'wfor', 'kids', 'batch')
if not f[1] then return 'missing' end
if f[1] == 'running' then return 'running' end
remove_job(id, f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10])
publish_woken()
return 'ok'
