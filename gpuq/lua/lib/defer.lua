-- lib/defer.lua: tasks held for later: delayed (due at a time) or waiting (for parents).
--
-- enqueue.lua checks a task's deferral (its `deferral`) and holds it here; fire.lua holds a
-- schedule's run here as due now, then queues it.

--@include args
--@include gates

-- Store held task id (its hash `fields` as enqueue writes a queued one, its deferral d):
-- delayed, in the delayed set at its due time, its score due + SLA (or its deadline,
-- counted from due, less its estimate if earlier); or waiting, in `waiting` and its pending
-- parents' `children`, its score set when they release it (lib/deps.lua). d.ready: its
-- parents ended already: it was queued as usual, only its parents are recorded here.
local function hold(id, fields, d, now, sla_ms, deadline_ms, est, tenancy)
  local tk = task_key(id)
  if d.ready then
    redis.call('HSET', tk, 'parents', table.concat(d.parents, ','))
    return
  end
  redis.call('HSET', tk, unpack(fields))
  local deadline = deadline_ms and (d.due or now) + math.max(1, math.floor(deadline_ms))
  if deadline then redis.call('HSET', tk, 'deadline', ms(deadline)) end
  if d.due then
    local score = d.due + sla_ms
    if deadline then score = math.min(score, deadline - math.floor(est * 1000)) end
    redis.call('HSET', tk, 'state', 'delayed', 'score', ms(score), 'due_at', ms(d.due))
    if tenancy then redis.call('HSET', tk, 'order', ms(d.due)) end
    add_delayed(d.due, id)
    return
  end
  redis.call('HSET', tk, 'state', 'waiting', 'parents', table.concat(d.parents, ','),
    'pending', ms(#d.pending), 'sla_ms', ms(sla_ms), 'after_any', d.any and '1' or '0')
  redis.call('ZADD', K_WAITING, now, id)
  for _, p in ipairs(d.pending) do
    redis.call('SADD', children_key(p), id)
    redis.call('HSET', task_key(p), 'children', '1')
  end
end
