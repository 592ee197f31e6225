-- lib/due.lua: what claim and reap both take care of: due retries, hand-overs not taken up.

--@include args
--@include push
--@include gates

-- The wake list entry of task id handed over to worker w, while the worker has not popped it.
local function unread_handover(w, id)
  for _, msg in ipairs(redis.call('LRANGE', wake_key(w), 0, -1)) do
    if string.byte(msg, 1) == 123 then  -- '{': a hand-over; the others are plain tokens
      local ok, f = pcall(cjson.decode, msg)
      if ok and f.id == id then return msg end
    end
  end
  return nil
end

-- Tasks handed over at enqueue (`handed`, scored by their pickup deadline), the earliest
-- `limit`. A hand-over leaves the set when its worker takes it up (began, or a heartbeat
-- renewing it) or when it is no longer running (ended, or back in a queue: push removes it,
-- so an entry of a running task is its hand-over's run). One not taken up by its deadline
-- is taken back, whether its worker died idle or was frozen when the server popped it for
-- it: off the wake list if still there, so it cannot run there, and requeued with its
-- attempt given back (a popped copy is fenced off by its token). Returns the earliest
-- deadline of those still in time (nil if none). The gate moves to what is left (gate: its
-- value as the caller read it, if it did).
local function reclaim_handed(now, limit, ttl, gate)
  local pending
  local entries = redis.call('ZRANGE', K_HANDED, '0', ms(limit - 1), 'WITHSCORES')
  for i = 1, #entries, 2 do
    local id, at = entries[i], tonumber(entries[i + 1])
    local f = redis.call('HMGET', task_key(id), 'state', 'worker')
    local running = f[1] == 'running' and f[2] and f[2] ~= ''
    if running and at > now then
      pending = math.min(pending or at, at)
    else
      redis.call('ZREM', K_HANDED, id)
      if running then
        local msg = unread_handover(f[2], id)
        if msg then redis.call('LREM', wake_key(f[2]), 1, msg) end
        requeue(id, now, msg and 'its worker did not pick it up' or 'its worker did not take it up',
          false, ttl)
      end
    end
  end
  if #entries == 2 * limit then gate_head('pickup_at', K_HANDED)  -- more may be listed
  elseif pending and pending ~= gate then redis.call('HSET', K_FAIRNESS, 'pickup_at', ms(pending))
  elseif not pending then redis.call('HDEL', K_FAIRNESS, 'pickup_at') end
  return pending
end

-- Move retries whose backoff has passed back into their queues (bounded per call; ttl: how
-- long one failed for a corrupt hash stays readable), or end those whose deadline can no
-- longer be met (expire_due); the gate moves to what is left. A task's `queued_at` is when
-- it became due (its delayed score), not its promotion: a late promotion is queue time.
local function promote_due(now, limit, ttl)
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', ms(now), 'WITHSCORES', 'LIMIT', '0', ms(limit))
  for i = 1, #due, 2 do
    local id, at = due[i], math.min(now, tonumber(due[i + 1]) or now)
    redis.call('ZREM', K_DELAYED, id)
    -- a hash deleted meanwhile: nothing to run
    if redis.call('EXISTS', task_key(id)) == 1
        and not expire_due(id, now, ttl, 'deadline passed while delayed') then
      redis.call('HSET', task_key(id), 'state', 'queued', 'queued_at', ms(at))
      push(id, now, ttl)
    end
  end
  gate_head('due_at', K_DELAYED)
  return #due / 2
end
