-- ARGV: prefix, n, then 12 per job (as INSERT_UNIQUE's), then how many of them have an idempotency
-- key, and per such job its place in the call (0, 1, ...), its key and its window (ms); then the
-- workflow part (as INSERT_FLOW's, counted: 0 when no job has parents). Issue 32: a job whose type
-- and key name a job (idem:<len>:<type>:<key>, a STRING that expires after the window: the key
-- outlives its job) is not inserted and answers that job's id, whatever became of it; a second job
-- of the call with one type and key answers the first's; the others are inserted as INSERT_FLOW
-- inserts them (a unique key may still hold one), and each key is recorded, for the window, naming
-- the id its job answered. Answers as INSERT_UNIQUE.
local n = tonumber(ARGV[2])
local at = 3 + n * 12
local keyed = {}  -- place -> {key, window}
for _ = 1, tonumber(ARGV[at]) do
  keyed[tonumber(ARGV[at + 1])] = {ARGV[at + 2], ARGV[at + 3]}
  at = at + 3
end
local flow = read_flow(ARGV, at + 1, true)
local answered = {}  -- place -> the id its key names (a job's, or a row's of the call)
local first = {}  -- idem key -> place of the row of the call that records it
local fresh = {}
local m = 0
for i = 0, n - 1 do
  local b = 3 + i * 12
  local entry = keyed[i]
  local name
  if entry then
    local t = ARGV[b + 1]
    name = P .. 'idem:' .. #t .. ':' .. t .. ':' .. entry[1]
    if first[name] then
      answered[i] = ARGV[3 + first[name] * 12]
    else
      answered[i] = redis.call('GET', name) or nil
      if not answered[i] then first[name] = i end
    end
  end
  if not answered[i] then
    for v = 0, 11 do fresh[#fresh + 1] = ARGV[b + v] end
    m = m + 1
  end
end
local inserted, err, held = 0, nil, {}
if m > 0 then
  inserted, err, held = insert_rows(fresh, 1, m, 12, flow)
  if not inserted then return redis.error_reply(err) end
end
local holder = {}
for j = 1, #held, 2 do holder[held[j]] = held[j + 1] end
for name, i in pairs(first) do
  local id = ARGV[3 + i * 12]
  redis.call('SET', name, holder[id] or id, 'PX', keyed[i][2])
end
local out = {}
for i = 0, n - 1 do
  local id = ARGV[3 + i * 12]
  local a = answered[i]
  if a then a = holder[a] or a else a = holder[id] end
  if a then
    out[#out + 1] = id
    out[#out + 1] = a
  end
end
if #out == 0 then return inserted end
table.insert(out, 1, inserted)
return out
