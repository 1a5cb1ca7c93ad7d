-- ARGV: prefix, n, then 9 per job, the last two its unique key and its trace context ('' for
-- none; rows with either come here, INSERT's rows have neither). As INSERT, but a row
-- whose key a pending or running job holds is not inserted. Returns how many were inserted if
-- every row was, else that count, then the id and the holder's id of each row not inserted.
local n, dup, held = insert_rows(ARGV, 3, tonumber(ARGV[2]), 9)
if not n then return redis.error_reply('DUPLICATE a job with id ' .. dup .. ' already exists') end
if #held == 0 then return n end
table.insert(held, 1, n)
return held
