-- lib/finish.lua: a task leaves the running set, or ends.

--@include args
--@include quota
--@include deps

-- A task stops running: out of the running set, its worker's tasks and, when it was charged
-- to a capped tenant (its `charged` field, which the caller read), its tenant's use.
local function release(id, worker, charged)
  redis.call('ZREM', K_RUNNING, id)
  if worker and worker ~= '' then redis.call('SREM', worker_tasks_key(worker), id) end
  discharge(id, charged)
end

-- End a task: terminal state, wake its waiters, keep it readable for ttl ms; counted per
-- state and per state and priority ("<state>:P<n>"; p read from the task unless given).
-- A parent (field `children` "1": read here, or given as kids by a caller that ends it
-- succeeded, ack) settles its children in the same call (lib/deps.lua); those it cancels
-- end here in turn.
local function finish(id, state, now, ttl, field, value, p, kids)
  local tk = task_key(id)
  redis.call('HSET', tk, 'state', state, 'finished_at', ms(now), field, value)
  p = level(p or redis.call('HGET', tk, 'priority'))  -- none in a corrupt hash
  if p then redis.call('HINCRBY', K_STATS, state .. ':P' .. p, 1) end
  local done = done_key(id)
  redis.call('LPUSH', done, state)
  redis.call('PEXPIRE', done, ttl)
  redis.call('PEXPIRE', tk, ttl)
  redis.call('HINCRBY', K_STATS, state, 1)
  -- a task whose producer asked for it (report_end, e.g. the rq bridge) and that ends other
  -- than succeeded (canceled, expired, a lost last attempt, a handler missing) is listed for
  -- that producer to report the end
  if state ~= 'succeeded' then
    local r = redis.call('HMGET', tk, 'report_end', 'children')
    if r[1] == '1' then redis.call('LPUSH', K_ENDED, id) end
    kids = r[2]
  end
  if kids == '1' then
    for _, c in ipairs(settle_children(id, state, now, ttl)) do
      finish(c[1], 'canceled', now, ttl, 'error', c[2])
    end
  end
end
