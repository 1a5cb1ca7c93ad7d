-- ARGV: prefix, n, then 12 per job (as INSERT_UNIQUE's), then the workflow part (read_flow's: per job
-- that has parents or a batch, its parents in ``after`` order, its on_parent_failure and batch; then
-- the call's batch record, if any). As INSERT_UNIQUE, and every parent not in the call must be
-- stored, else the call fails naming them (UNKNOWN, then a JSON list) and writes nothing; a batch
-- id that exists fails it too (DUPLICATE). Each job is inserted waiting, pending or cancelled as its
-- parents are now (insert_rows), its edges with it, and the batch record in the same step.
local n = tonumber(ARGV[2])
local flow = read_flow(ARGV, 3 + n * 12, true)
local inserted, err, held = insert_rows(ARGV, 3, n, 12, flow)
if not inserted then return redis.error_reply(err) end
if #held == 0 then return inserted end
table.insert(held, 1, inserted)
return held
