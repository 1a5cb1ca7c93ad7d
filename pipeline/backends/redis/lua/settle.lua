-- ARGV: prefix, n, then 3 per outcome: id, "token kind delay_ms has_error(1/0)", error (for kind
-- result: the result; for step and suspend: durable_part's). Kinds: start, succeed, result (succeed
-- storing a result), bury, retry, release, cancel, snooze/<limit>, step, suspend (its delay 'f' for
-- none: due at FOREVER_MS).
-- In the order given (the same job twice: the second sees what the first wrote). Returns a
-- string with a "1" per outcome written, a "0" per stale one (not running, or under another
-- token: nothing changed). (Packed: fewer values to encode and parse per outcome.) An ARGV "q"
-- after the outcomes: quiet (see the end).
-- A job whose cancel was requested (field creq) never goes back to pending: a retry, release,
-- snooze or suspend of it ends it cancelled instead (one final state, never retried after a cancel).
-- Durable functions (issue 35; the prelude has the keys): a step writes its step (put_step) and the job
-- runs on. A suspend writes its step if it has one, then is a snooze to another status: the attempt
-- given back, the lease and limit slots left, expires_at cleared (it applies to the first start), the
-- snoozes unchanged; suspended (in the suspended set, due after the delay; await: the signal waited
-- for), or pending due now when a signal of the name it waits for was sent and not consumed yet.
-- A keyed job (lkey) leaves its key's running set whatever the outcome but START; back to pending,
-- it goes to its key's sets, and a job of unique_while "pending" holds its key again if it is free.
-- A job that ends (completed, dead, cancelled) and has children (field kids) applies its edges
-- (release_children); a job without reads the field kids, nothing more.
local n = tonumber(ARGV[2])
local now = now_ms()
local out = {}
local wake = false
for i = 0, n - 1 do
  local b = 3 + i * 3
  local id = ARGV[b]
  local token, kind, delay, has_error = string.match(ARGV[b + 1], '^(%S+) (%S+) (%S+) (%S+)$')
  local key = jkey(id)
  local f = redis.call('HMGET', key, 'status', 'token', 'type', 'prio', 'started', 'attempts', 'ukey', 'creq', 'expat',
                       'lkey', 'uwhile', 'kids')
  if f[1] ~= 'running' or f[2] ~= token then
    out[i + 1] = '0'
  else
    out[i + 1] = '1'
    local t, p = f[3], f[4]
    if kind == 'start' then
      if not f[5] then redis.call('HSET', key, 'started', now, 'attempts', tonumber(f[6]) + 1) end
    elseif kind == 'step' then
      local _, name, body = durable_part(ARGV[b + 2])
      put_step(id, name, body)
    else
      redis.call('ZREM', P .. 'leases', id)
      off_running(id, t, f[10])
      local err = ARGV[b + 2]
      local awaiting
      if kind == 'suspend' then
        local name, body
        awaiting, name, body = durable_part(err)
        if name then put_step(id, name, body) end
      end
      if f[8] then
        drop_request(id, key)
        if kind == 'retry' or kind == 'release' or string.sub(kind, 1, 7) == 'snooze/' or kind == 'suspend' then
          local ended = kind == 'suspend' and 'suspended' or 'released'
          err = 'cancelled while running (cancel requested); its attempt ended: ' .. (has_error == '1' and err or ended)
          kind, has_error = 'cancel', '1'
        end
      end
      redis.call('HDEL', key, 'owner', 'expires')
      if kind == 'succeed' then
        redis.call('HSET', key, 'status', 'completed', 'updated', now)
        index_status(id, t, 'running', 'completed')
        finish(id, 'completed', now)
        free_key(id, t, f[7])
        if f[12] then release_children(id, 'completed', now) end
      elseif kind == 'bury' then
        redis.call('HSET', key, 'status', 'dead', 'updated', now)
        if has_error == '1' then redis.call('HSET', key, 'error', err) end
        index_status(id, t, 'running', 'dead')
        finish(id, 'dead', now)
        free_key(id, t, f[7])
        if f[12] then release_children(id, 'dead', now) end
      elseif kind == 'retry' then
        local run = now + tonumber(delay)
        redis.call('HSET', key, 'status', 'pending', 'updated', now, 'run', run)
        if has_error == '1' then redis.call('HSET', key, 'error', err) end
        redis.call('HDEL', key, 'started', 'progress', 'pmsg')
        index_status(id, t, 'running', 'pending')
        to_pending(id, t, p, run, f[10], now)
        if f[9] then expiring_add(id, t, f[9]) end
        if f[11] and f[7] then hold_again(id, t, f[7]) end
      elseif kind == 'release' then -- due at once, the attempt given back if it was counted
        local attempts = tonumber(f[6])
        if f[5] then attempts = math.max(attempts - 1, 0) end
        redis.call('HSET', key, 'status', 'pending', 'updated', now, 'run', now, 'attempts', attempts)
        redis.call('HDEL', key, 'started', 'progress', 'pmsg')
        index_status(id, t, 'running', 'pending')
        to_pending(id, t, p, now, f[10], now)
        if f[9] then expiring_add(id, t, f[9]) end
        if f[11] and f[7] then hold_again(id, t, f[7]) end
        wake = true
      elseif kind == 'result' then
        redis.call('HSET', key, 'status', 'completed', 'updated', now, 'result', err)
        index_status(id, t, 'running', 'completed')
        finish(id, 'completed', now)
        free_key(id, t, f[7])
        if f[12] then release_children(id, 'completed', now) end
      elseif kind == 'cancel' then
        redis.call('HSET', key, 'status', 'cancelled', 'updated', now)
        if has_error == '1' then redis.call('HSET', key, 'error', err) end
        index_status(id, t, 'running', 'cancelled')
        finish(id, 'cancelled', now)
        free_key(id, t, f[7])
        if f[12] then release_children(id, 'cancelled', now) end
      elseif kind == 'suspend' then -- see the top
        local attempts = tonumber(f[6])
        if f[5] then attempts = math.max(attempts - 1, 0) end
        redis.call('HDEL', key, 'started', 'progress', 'pmsg', 'expat')
        if awaiting and signal_kept(id, awaiting) then  -- its signal came already: nothing to wait for
          redis.call('HSET', key, 'status', 'pending', 'updated', now, 'run', now, 'attempts', attempts)
          index_status(id, t, 'running', 'pending')
          to_pending(id, t, p, now, f[10], now)
          wake = true
        else
          local run = delay == 'f' and FOREVER_MS or math.min(now + tonumber(delay), FOREVER_MS)
          redis.call('HSET', key, 'status', 'suspended', 'updated', now, 'run', run, 'attempts', attempts)
          if awaiting then redis.call('HSET', key, 'await', awaiting) end
          index_status(id, t, 'running', 'suspended')
          redis.call('ZADD', P .. 'suspended', run, id)
        end
        if f[11] and f[7] then hold_again(id, t, f[7]) end
      else -- snooze/<limit>: pending after the delay, the attempt given back as release gives it back
        -- (also when the snooze is one too many and the job ends dead: a snooze is no failed attempt)
        local snoozes = tonumber(redis.call('HGET', key, 'snoozes') or '0') + 1
        local attempts = tonumber(f[6])
        if f[5] then attempts = math.max(attempts - 1, 0) end
        if snoozes > tonumber(string.sub(kind, 8)) then
          redis.call('HSET', key, 'status', 'dead', 'updated', now, 'snoozes', snoozes, 'attempts', attempts)
          if has_error == '1' then redis.call('HSET', key, 'error', err) end
          index_status(id, t, 'running', 'dead')
          finish(id, 'dead', now)
          free_key(id, t, f[7])
          if f[12] then release_children(id, 'dead', now) end
        else
          local run = now + tonumber(delay)
          redis.call('HSET', key, 'status', 'pending', 'updated', now, 'run', run, 'attempts', attempts, 'snoozes', snoozes)
          redis.call('HDEL', key, 'started', 'progress', 'pmsg')
          index_status(id, t, 'running', 'pending')
          to_pending(id, t, p, run, f[10], now)
          if f[9] then expiring_add(id, t, f[9]) end
          if f[11] and f[7] then hold_again(id, t, f[7]) end
          if run <= now then wake = true end
        end
      end
    end
  end
end
-- quiet (ARGV after the outcomes: "q"): the jobs this batch woke are answered after a "|", comma
-- separated, and not PUBLISHed: the caller claims them at once and PUBLISHes for any it left
if ARGV[3 + n * 3] == 'q' and not wake then
  if WF.woke then return table.concat(out) .. '|' .. table.concat(WF.ids, ',') end
  return table.concat(out)
end
if wake or WF.woke then redis.call('PUBLISH', P .. 'wake', '1') end
return table.concat(out)
