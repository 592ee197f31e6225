-- lib/queue.lua: a queued task in its (priority, model) queue and the pool's indexes.

--@include tally

-- Keep the index score of (p, m) equal to its queue's head score; drop it when empty.
local function refresh_head(p, m)
  local head = redis.call('ZRANGE', queue_key(p, m), 0, 0, 'WITHSCORES')
  if head[1] then
    redis.call('ZADD', models_with_work_key(p), head[2], m)
  else
    redis.call('ZREM', models_with_work_key(p), m)
  end
end

-- A task with a deadline is watched by the reaper's expiry pass from its latest start
-- (deadline - estimate), so only tasks near or past it are ever looked at.
local function watch_deadline(id, deadline, est_s)
  if deadline and deadline ~= '' then
    redis.call('ZADD', K_DEADLINES, tonumber(deadline) - math.floor(tonumber(est_s) * 1000), id)
  end
end

-- Index a task whose hash is written into its (priority, model) queue at its score.
local function index(id, p, m, score, need)
  redis.call('ZADD', queue_key(p, m), score, id)
  redis.call('ZADD', models_with_work_key(p), 'LT', score, m)
  redis.call('ZADD', K_NEED, need, id)
end

-- Take a queued task out of its queue and the indexes (the deadline index unless the
-- caller knows the task has no deadline; the queue's head in the index unless keep_head:
-- a caller taking several tasks of one queue refreshes it once, after the last).
local function unqueue(id, p, m, has_deadline, keep_head)
  set_write('ZREM', queue_key(p, m), id)
  if not keep_head then refresh_head(p, m) end
  set_write('ZREM', K_NEED, id)
  if has_deadline ~= false then set_write('ZREM', K_DEADLINES, id) end
end
