-- reap.lua: recover what dead workers left behind and promote due retries (bounded).
--
-- Expired leases go back to their queues (the attempt counts, so a task that keeps killing
-- its worker ends "failed" after max_attempts). Workers whose liveness expired are removed
-- with their idle entry, model holdings, wake and control lists and reservation, and
-- their running tasks requeued at once rather than at lease expiry (a task handed over to
-- one and not taken up with its attempt given back: it never started).
-- Queues a client of an older release indexed per level (models:<p>) join the work index. The claim's gates for
-- due retries, hand-overs and tenancy are set from what they guard (lib/gates.lua).
--
-- KEYS[1]  pool key base
-- ARGV[1]  now (ms; "0" = server clock)
-- ARGV[2]  limit: most leases, workers and retries handled per call
-- ARGV[3]  result TTL (ms)
-- Returns  {0, requeued, failed, dead_workers, promoted, recovered} (failed also counts tasks
--          whose hash was corrupt: they end failed with the field in their error); recovered
--          names them for the reaper's log: {worker, id, state} per task (worker '' for a
--          lease that expired; state queued, failed or expired) and {worker} for a dead
--          worker that ran none
--          {1, 0, reason} INVALID: a malformed argument (nothing written)

--@include args
--@include finish
--@include push
--@include queue
--@include due
--@include gates
--@include depart

if #ARGV ~= 3 then return {1, 0, 'expected 3 arguments'} end
local now, limit, ttl = clock(ARGV[1]), arg_num(2, 1, 1e6, true), ttl_arg(3)
if not (now and limit and ttl) then return {1, 0, 'now and ttl must be ms >= 0, limit 1..1e6'} end
local requeued, failed, recovered = 0, 0, {}

local function recover(id, reason, consume, dead_worker)
  local f = redis.call('HMGET', task_key(id), 'state', 'worker', 'charged', 'report_end')
  if f[1] ~= 'running' then
    release(id, f[2], f[3])
    return
  end
  local state = requeue(id, now, reason, consume ~= false, ttl)
  recovered[#recovered + 1] = {dead_worker or '', id, state}
  if state == 'queued' then
    requeued = requeued + 1
    -- its handler's last word (started) stands wherever it reported: the reporter learns
    -- from `ended` that the task waits again (a failed one finish lists itself)
    if f[4] == '1' then redis.call('LPUSH', K_ENDED, id) end
  elseif state == 'failed' then  -- an expired one (lib/push.lua expire_due) is neither
    failed = failed + 1
  end
end

local dead = redis.call('ZRANGEBYSCORE', K_WORKERS, '-inf', now, 'LIMIT', 0, limit)
for _, w in ipairs(dead) do
  local wk = worker_key(w)
  depart(w, redis.call('HGET', wk, 'models'))  -- first: its requeued tasks are not offered back to it
  local before = #recovered
  for _, id in ipairs(redis.call('SMEMBERS', worker_tasks_key(w))) do
    -- handed over at enqueue and never taken up: it did not start, so its attempt is given
    -- back, as at its pickup deadline (lib/due.lua)
    local unread = redis.call('ZSCORE', K_HANDED, id) or unread_handover(w, id) ~= nil
    recover(id, unread and 'its worker died before picking it up' or 'worker ' .. w .. ' died', not unread, w)
  end
  if #recovered == before then recovered[#recovered + 1] = { w } end
  redis.call('DEL', wk, worker_tasks_key(w), wake_key(w), control_key(w), reservation_key(w))
end

-- hand-overs left unread past their pickup deadline, also where no worker claims
reclaim_handed(now, limit, ttl)

for _, id in ipairs(redis.call('ZRANGEBYSCORE', K_RUNNING, '-inf', now, 'LIMIT', 0, limit)) do
  recover(id, 'lease expired')
end

-- queues a client of an older release indexed per level (models:<p>) join the work index
-- (lib/queue.lua), the lower head score winning: a rolling upgrade strands no task
local old = {}
for p = 0, 3 do old[p + 1] = legacy_models_with_work_key(p) end
if redis.call('EXISTS', unpack(old)) > 0 then
  for p = 0, 3 do
    local entries = redis.call('ZRANGE', old[p + 1], 0, limit - 1, 'WITHSCORES')
    for i = 1, #entries, 2 do
      index_head(p, entries[i], entries[i + 1])
      redis.call('ZREM', old[p + 1], entries[i])
    end
  end
end

local promoted = promote_due(now, limit, ttl)
gate_tenancy()  -- due_at and pickup_at were set above (lib/due.lua), from the sets themselves
return {0, requeued, failed, #dead, promoted, recovered}
