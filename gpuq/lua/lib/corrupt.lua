-- lib/corrupt.lua: a stored task a field of which is missing or malformed ends failed.

--@include args
--@include queue
--@include failures
--@include tenancy

-- Which field of a stored task keeps it from being queued (missing or malformed: a hash
-- corrupted by hand or by a foreign client), or nil. Scripts end such a task "failed" with
-- the field in its error rather than stop on it, so it wedges no queue and reaches no worker.
local function defect(p, m, vram, est, score, deadline)
  if not level(p) then return 'priority' end
  if not m or m == '' then return 'model' end
  local v, e = finite(vram), finite(est)
  if not v or v <= 0 then return 'vram_gb' end
  if not e or e < 0 or e > 1e10 then return 'est_s' end
  if not finite(score) then return 'score' end
  if deadline and deadline ~= '' and not finite(deadline) then return 'deadline' end
  return nil
end

local function corrupt(field) return 'corrupt task: field ' .. field .. ' is missing or malformed' end

-- End a task whose hash is corrupt (`defect`): failed, with the field in its error, and out
-- of its queue (when its priority and model name one), the indexes and its tenant's count.
local function fail_corrupt(id, field, p, m, now, ttl)
  fair_leave(id, redis.call('HGET', task_key(id), 'fair'))
  if type(p) == 'string' and type(m) == 'string' then
    unqueue(id, p, m)
  else
    redis.call('ZREM', K_NEED, id)
    redis.call('ZREM', K_DEADLINES, id)
  end
  end_failed(id, now, ttl, corrupt(field))
end
