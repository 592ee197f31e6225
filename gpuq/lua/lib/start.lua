-- lib/start.lua: a task starts on a worker (a claim, or a hand-over at enqueue).

--@include args
--@include queue
--@include tally
--@include tenancy

-- each level's stats field of a met SLA, by its text and number: a lookup, not a new string
local SLA_MET = {[0] = 'sla_met:P0', 'sla_met:P1', 'sla_met:P2', 'sla_met:P3', ['0'] = 'sla_met:P0',
  ['1'] = 'sla_met:P1', ['2'] = 'sla_met:P2', ['3'] = 'sla_met:P3'}

-- Remember a missed SLA for `gpuq top` (newest first, the last 100: gpuq/keys.py MISSES_KEPT).
-- An expiry (kind "expired") of a task that never started (began: its began_at, unset while
-- its SLA is undecided) is counted missed too, for the pool and its tenant: a task expires
-- only once its handler could no longer start (its model loaded) by its latest start
-- (deadline - est_s), which is never before its start-by score. An operator's requeue of it
-- takes the count back (requeue.lua).
local function note_miss(id, p, m, wait_ms, now, kind, began, tenant)
  redis.call('LPUSH', K_SLA_MISSES, cjson.encode({id = id, priority = 'P' .. p, model = m,
    wait_s = wait_ms / 1000, at = now / 1000, kind = kind}))
  redis.call('LTRIM', K_SLA_MISSES, 0, 99)
  if kind == 'expired' and (not began or began == '') then
    count_stat('sla_missed:P' .. p)
    if tenant and tenant ~= '' and tenancy_on() then count_tenant_sla(p, tenant, 'missed') end
  end
end

-- Decide the SLA of task id (priority p, model m) at its first handler start, now: met by
-- its start-by score or missed, noted with its wait since `since` (enqueued, or due for a
-- delayed or released task) as late when the task was started (claimed or handed over, at
-- started) after its score, else as cold: its model load made it late.
-- The caller writes began_at = now, which marks the task decided: one started again (a
-- yield, a stop or a lost lease gives it back) counts once. Returns "met" or "missed".
local function decide_sla(id, p, m, now, score, since, started)
  if now <= score then
    count_stat(SLA_MET[p] or 'sla_met:P' .. p)
    return 'met'
  end
  count_stat('sla_missed:P' .. p)
  note_miss(id, p, m, now - since, now, started > score and 'late' or 'cold')
  return 'missed'
end

-- Start task id on worker w: a fresh fencing token, its lease (until lease_until), the
-- worker's task set. Claim and enqueue's hand-over share it. The SLA is decided where the
-- handler starts: here for a task whose SLA is undecided and whose model the worker holds
-- (warm: its handler starts at once); for one started cold it is left to began.lua, which
-- the worker calls after the load. A previous attempt's `error` is cleared; erred = false:
-- the caller read the whole hash and it has none (a first start), so nothing is written there
-- (a field less to write, and to scan past in every later lookup of the hash). Returns the
-- token and the reply's sla: "met" or "missed" (decided here), "pending" (the worker reports
-- the handler's start: every cold start, since began.lua also ends its `loading`) or "" (a
-- warm start an earlier start decided).
local function start(id, p, m, w, now, lease_until, attempt, score, since, undecided, warm, erred)
  local token = new_token()
  local token_ms, until_ms = ms(token), ms(lease_until)
  local at = ms(now)  -- last: the claim reply's started_at is the same text (ms keeps it)
  local began = undecided and warm
  if erred == false and began then
    redis.call('HSET', task_key(id), 'state', 'running', 'worker', w, 'token', token_ms,
      'attempt', attempt, 'started_at', at, 'began_at', at)
  elseif erred == false then
    redis.call('HSET', task_key(id), 'state', 'running', 'worker', w, 'token', token_ms,
      'attempt', attempt, 'started_at', at)
  elseif began then
    redis.call('HSET', task_key(id), 'state', 'running', 'worker', w, 'token', token_ms,
      'attempt', attempt, 'started_at', at, 'error', '', 'began_at', at)
  else
    redis.call('HSET', task_key(id), 'state', 'running', 'worker', w, 'token', token_ms,
      'attempt', attempt, 'started_at', at, 'error', '')
  end
  set_write('ZADD', K_RUNNING, until_ms, id)
  set_write('SADD', worker_tasks_key(w), id)
  local sla = warm and '' or 'pending'
  if undecided and warm then
    sla = decide_sla(id, p, m, now, score, since, now)  -- numbers (callers)
  end
  return token, sla
end

-- The catalog's mean measured load time of model m (ms; 0 before its first load).
local function mean_load_ms(m)
  local c = redis.call('HMGET', catalog_model_key(m), 'loads', 'total_load_s')
  local loads, total = finite(c[1]) or 0, finite(c[2]) or 0
  if loads < 1 or total < 0 then return 0 end
  return math.floor(total / loads * 1000)
end

-- A cold start (the worker loads the task's model first): `loading` until began.lua, and
-- when the model should be loaded, by its mean measured load (no ready_at before its first
-- load). The preemption planner counts a victim's runtime and end from there, and from no
-- sooner than now while it loads: asking a task to yield while it loads would throw the
-- load away (it yields only once its handler runs), and a load may outlast its mean.
local function note_cold_start(id, m, now)
  local load = mean_load_ms(m)
  if load > 0 then
    redis.call('HSET', task_key(id), 'loading', '1', 'ready_at', ms(now + load))
  else
    redis.call('HSET', task_key(id), 'loading', '1')
  end
end

-- Fairness after k dispatches at level p (k: 1 unless given, a batch's count): its debt is
-- paid; each lower level with work saw k more higher dispatches, counted up to fair_every
-- (fair: the `fair` hash's values for levels 1..3; has_work: what the caller knows of which
-- levels have work, true, false or nil by level, else what the index's ends tell; for a level
-- neither tells, the index is read once from level p + 1, and a level that cannot tell alone).
local function count_dispatch(p, fair, fair_every, k, has_work)
  if p > 0 and fair[p] ~= '0' and finite(fair[p]) ~= 0 then  -- "0": no number read
    redis.call('HSET', K_FAIRNESS, tostring(p), '0')
  end
  local read = nil
  for q = p + 1, 3 do
    local seen = finite(fair[q]) or 0
    if seen < fair_every then
      has_work = has_work or work_ends()
      local known = has_work[q]
      if known == nil then
        read = read or work_levels(work_from(p + 1, 16), 16)
        known = read[q]
      end
      if known == nil then known = work_page(q, 0, 1)[1] ~= nil end
      if known then redis.call('HINCRBY', K_FAIRNESS, tostring(q), math.min(k or 1, fair_every - seen)) end
    end
  end
end
