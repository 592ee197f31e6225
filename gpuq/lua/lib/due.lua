-- lib/due.lua: what claim and reap both take care of: due retries, unread hand-overs.

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
-- `limit`: one whose worker has popped it off its wake list was picked up (it holds its
-- full lease) and only leaves the set, as does one that ended or went back to a queue (no
-- script that ends a task looks at the set: the next claim or reaper round tidies it); one
-- still unread at its deadline (its worker died idle, or stalls) is taken off the wake list,
-- so it cannot run there, and requeued with its attempt given back. Returns the earliest
-- deadline of those still unread in time (nil if none). The gate moves to what is left
-- (gate: its value as the caller read it, if it did).
local function reclaim_handed(now, limit, ttl, gate)
  local pending
  local entries = redis.call('ZRANGE', K_HANDED, '0', ms(limit - 1), 'WITHSCORES')
  for i = 1, #entries, 2 do
    local id, at = entries[i], tonumber(entries[i + 1])
    local f = redis.call('HMGET', task_key(id), 'state', 'worker')
    local msg = f[1] == 'running' and f[2] and unread_handover(f[2], id)
    if msg and at > now then
      pending = math.min(pending or at, at)
    else
      redis.call('ZREM', K_HANDED, id)
      if msg then
        redis.call('LREM', wake_key(f[2]), 1, msg)
        requeue(id, now, 'its worker did not pick it up', false, ttl)
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
