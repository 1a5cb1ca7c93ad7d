-- ARGV: prefix, staging list, answer key, and a second list with the workflow part of the rows
-- when any has parents or a batch (read_flow's values). A bulk load's part, pushed to a list of
-- its own first (not job state: nothing claims it; 12 values per row, as INSERT_UNIQUE's), committed here in
-- one step, every row or none; the list is deleted. Answers as INSERT_UNIQUE, and keeps that
-- answer under the answer key for a day: run again (its first answer lost with a connection),
-- it answers the same and inserts nothing more, so a caller can always learn what happened.
local kept = redis.call('GET', ARGV[3])
if kept then
  local answer = cjson.decode(kept)
  if answer.err then return redis.error_reply(answer.err) end
  return answer.ok
end
if redis.call('EXISTS', ARGV[2]) == 0 then
  return redis.error_reply('GONE the staged rows of ' .. ARGV[2] .. ' are gone (expired): nothing of them was inserted')
end
local rows = redis.call('LRANGE', ARGV[2], 0, -1)
redis.call('DEL', ARGV[2])
local flow
if ARGV[4] then  -- the workflow part of the rows (read_flow's entries, uncounted), staged in a list of its own
  flow = read_flow(redis.call('LRANGE', ARGV[4], 0, -1), 1, false)
  redis.call('DEL', ARGV[4])
end
local n, err, held = insert_rows(rows, 1, #rows / 12, 12, flow)
local answer
if not n then
  answer = {err = err}
elseif #held == 0 then
  answer = {ok = n}
else
  table.insert(held, 1, n)
  answer = {ok = held}
end
redis.call('SET', ARGV[3], cjson.encode(answer), 'EX', 86400)
if answer.err then return redis.error_reply(answer.err) end
return answer.ok
