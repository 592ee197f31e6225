-- lib/finish.lua: a task leaves the running set, or ends.

--@include args
--@include quota
--@include deps
--@include tally

-- A task stops running: out of the running set, its worker's tasks and, when it was charged
-- to a capped tenant (its `charged` field, which the caller read), its tenant's use.
local function release(id, worker, charged)
  set_write('ZREM', K_RUNNING, id)
  if worker and worker ~= '' then set_write('SREM', worker_tasks_key(worker), id) end
  discharge(id, charged)
end

-- End a task: terminal state, wake its waiters, keep it readable for ttl ms; counted per
-- state and priority ("<state>:P<n>"; p read from the task unless given; "<state>:unleveled"
-- for a corrupt hash without one): one count a task, totals are their sum (gpuq/task.py).
-- Its done list is pushed only when a waiter registered (field `waited`, wait.lua): a task
-- nobody waits on leaves no done key.
-- A task marked `streamed` (it emitted a chunk, or a reader follows it: emit.lua,
-- follow.lua) gets the end marker {end = state} on its stream, which takes the same TTL. A
-- parent (field `children` "1") settles its children in the same call (lib/deps.lua); those
-- it cancels end here in turn. `streamed`, `children` and `waited` are read with
-- report_end, or given by a caller that ends the task succeeded and read them already (ack
-- reads them with the lease, so a task that never streamed, has no children and no waiter
-- costs it nothing more). They are read before the hash's TTL is set: a TTL of 0 deletes it.
-- Returns the children it cancels, {child, reason} each.
local function end_task(id, state, now, ttl, field, value, p, streamed, kids, waited)
  local tk = task_key(id)
  redis.call('HSET', tk, 'state', state, 'finished_at', ms(now), field, value)
  p = level(p or redis.call('HGET', tk, 'priority'))  -- none in a corrupt hash
  count_stat(state .. (p and ':P' .. p or ':unleveled'))
  local report = false
  if state ~= 'succeeded' or streamed == nil then
    local g = redis.call('HMGET', tk, 'report_end', 'streamed', 'children', 'waited')
    report, streamed, kids, waited = g[1] == '1', g[2], g[3], g[4]
  end
  redis.call('PEXPIRE', tk, ttl)
  if waited == '1' then
    local done = done_key(id)
    redis.call('LPUSH', done, state)
    redis.call('PEXPIRE', done, ttl)
  end
  if streamed == '1' then
    local sk = stream_key(id)
    redis.call('XADD', sk, '*', 'end', state)
    redis.call('PEXPIRE', sk, ttl)
  end
  -- a task whose producer asked for it (report_end, e.g. the rq bridge) and that ends other
  -- than succeeded (canceled, expired, a lost last attempt, a handler missing) is listed for
  -- that producer to report the end
  if report and state ~= 'succeeded' then redis.call('LPUSH', K_ENDED, id) end
  if kids == '1' then return settle_children(id, state, now, ttl) end
  return nil
end

-- End a task (end_task), and the waiting descendants its end cancels: a work list rather
-- than recursion, so a chain of any length ends whole within Lua's stack.
local function finish(id, state, now, ttl, field, value, p, streamed, kids, waited)
  local todo = end_task(id, state, now, ttl, field, value, p, streamed, kids, waited)
  local i = 1
  while todo and todo[i] do
    local c = todo[i]
    todo[i] = false  -- done: its memory goes
    for _, more in ipairs(end_task(c[1], 'canceled', now, ttl, 'error', c[2]) or {}) do
      todo[#todo + 1] = more
    end
    i = i + 1
  end
end
