-- ARGV: prefix, n, then 12 per job, the last five its unique key, its trace context, its
-- expires_at in ms, its limit key ('' for none) and '1' for unique_while "pending" ('' for the
-- default; rows with any come here, INSERT's rows have none). As INSERT, but a row
-- whose key a pending or running job holds is not inserted. Returns how many were inserted if
-- every row was, else that count, then the id and the holder's id of each row not inserted.
local n, err, held = insert_rows(ARGV, 3, tonumber(ARGV[2]), 12)
if not n then return redis.error_reply(err) end
if #held == 0 then return n end
table.insert(held, 1, n)
return held
