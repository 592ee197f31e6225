-- lib/push.lua: a task goes back to its queue (requeue, retry promotion).

--@include args
--@include queue
--@include corrupt
--@include wake
--@include finish
--@include failures
--@include tenancy
--@include start

-- Put a stored task back into its queue at its stored place (its fair `order` when it had
-- one, else its start-by score), and wake a worker for it. While tenancy is on it counts in
-- its tenant's queued tasks again. Returns "queued", or "failed" for a corrupt hash
-- (`fail_corrupt`, kept for ttl ms).
local function push(id, now, ttl)
  local f = redis.call('HMGET', task_key(id), 'priority', 'model', 'score', 'vram_gb', 'deadline',
    'est_s', 'order', 'tenant', 'gpus')
  local bad = defect(f[1], f[2], f[4], f[6], f[3], f[5])
  if bad then
    fail_corrupt(id, bad, f[1], f[2], now, ttl)
    return 'failed'
  end
  local fair_field = ''
  if f[8] and f[8] ~= '' and tenancy_on() then
    fair_field = f[1] .. ':' .. f[8]
    redis.call('HINCRBY', K_TENANT_QUEUED, fair_field, 1)
  end
  index(id, f[1], f[2], finite(f[7]) or f[3], f[4], tonumber(f[9]))
  redis.call('ZREM', K_HANDED, id)  -- a hand-over's entry: only its own run may be taken back
  watch_deadline(id, f[5], f[6])
  local idle_n = redis.call('ZCARD', K_IDLE)
  local offered, woken = wake(f[2], tonumber(f[4]), f[1], idle_n, tonumber(f[9]) or 1, now)
  redis.call('HSET', task_key(id), 'offered', offered or '', 'fair', fair_field)
  -- a woken worker has left the idle set: a pool-wide wake too while others remain
  if not woken or idle_n > 1 then wake_pool(1) end
  return 'queued'
end

-- A task going back to its queue (a due retry or delayed task, a requeue) that can no longer
-- end by its deadline (now + its estimate past it) ends expired instead: a woken worker's
-- claim (or the claim that promoted it) would start it before the reaper's expiry pass
-- (expire.lua) could look at it. The model's load time is left to that pass. `how`: where it
-- waited, as the error says it when the deadline passed. Returns whether it expired it.
local function expire_due(id, now, ttl, how)
  local f = redis.call('HMGET', task_key(id), 'deadline', 'est_s', 'priority', 'model',
    'due_at', 'enqueued_at', 'began_at', 'tenant')
  local deadline, est = finite(f[1]), finite(f[2])
  if not deadline or not est or not level(f[3]) then return false end  -- push judges a corrupt one
  local run = math.floor(est * 1000)
  if now + run <= deadline then return false end
  local reason = now >= deadline and how
    or string.format('deadline cannot be met: %.3f s left, task needs %.3f s',
      (deadline - now) / 1000, run / 1000)
  finish(id, 'expired', now, ttl, 'error', reason)
  note_miss(id, level(f[3]), f[4], now - (finite(f[5]) or finite(f[6]) or now), now, 'expired', f[7],
    f[8])
  return true
end

-- Running task back to its queue (lost lease, shutdown, yield). consume=false gives the
-- attempt back. Fails it for good once a lost lease has used its last attempt, or when its
-- attempt counts are corrupt.
local function requeue(id, now, reason, consume, ttl)
  local tk = task_key(id)
  local f = redis.call('HMGET', tk, 'worker', 'attempt', 'max_attempts', 'priority', 'model',
    'charged')
  release(id, f[1], f[6])
  redis.call('HDEL', tk, 'yield_by', 'yield_for')
  local attempt, tries = finite(f[2]), finite(f[3])
  if not (attempt and attempt == math.floor(attempt) and tries) then
    fail_corrupt(id, attempt and 'max_attempts' or 'attempt', f[4], f[5], now, ttl)
    return 'failed'
  end
  if consume and attempt >= tries then
    end_failed(id, now, ttl, reason .. ' (after ' .. f[2] .. (f[2] == '1' and ' attempt)' or ' attempts)'))
    return 'failed'
  end
  if not consume then attempt = attempt - 1 end
  if expire_due(id, now, ttl, 'deadline passed while it ran') then
    redis.call('HSET', tk, 'worker', '', 'token', '', 'attempt', ms(attempt))
    return 'expired'
  end
  redis.call('HSET', tk, 'state', 'queued', 'worker', '', 'token', '', 'error', reason,
    'queued_at', ms(now), 'ready_at', '', 'loading', '',
    'attempt', ms(attempt))
  return push(id, now, ttl)
end
