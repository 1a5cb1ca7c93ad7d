-- ARGV: prefix, n, then 10 per job, the last three its unique key, its trace context and its
-- expires_at in ms ('' for none; rows with any come here, INSERT's rows have none). As INSERT, but a row
-- whose key a pending or running job holds is not inserted. Returns how many were inserted if
-- every row was, else that count, then the id and the holder's id of each row not inserted.
local n, dup, held = insert_rows(ARGV, 3, tonumber(ARGV[2]), 10)
if not n then return redis.error_reply('DUPLICATE a job with id ' .. dup .. ' already exists') end
if #held == 0 then return n end
table.insert(held, 1, n)
return held
