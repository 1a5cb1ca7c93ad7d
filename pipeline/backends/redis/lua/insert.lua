-- ARGV: prefix, n, then 7 per job (none has a unique key, a trace context or an expires_at: INSERT_UNIQUE's).
-- Every row or none:
-- a duplicate id (stored, or twice in the call) is found before the first write. Returns n.
local n, err = insert_rows(ARGV, 3, tonumber(ARGV[2]), 7)
if not n then return redis.error_reply(err) end
return n
