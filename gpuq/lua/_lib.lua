-- _lib.lua: shared helpers, prepended by gpuq/scripts.py to every script (not run alone).
--
-- Every script receives the pool's key base (e.g. "gpuq:{default}:") as KEYS[1] and builds
-- the per-task, per-queue and per-worker names from it; all of them carry the pool's hash
-- tag, so a script touches one Cluster slot. Key suffixes are tabled in docs/PROTOCOL.md.
-- Times are integer epoch milliseconds. Return values are arrays whose first element is a
-- code: 0 OK, 1 INVALID, 2 DUPLICATE, 3 UNSCHEDULABLE, 4 NOT_FOUND, 5 STALE_LEASE,
-- 6 FINISHED, 7 UNREGISTERED (gpuq/scripts.py: Code).

local B = KEYS[1]
local K_RUNNING, K_DELAYED, K_NEED = B .. 'running', B .. 'delayed', B .. 'need'
local K_IDLE, K_WAKE, K_WORKERS = B .. 'idle', B .. 'wake', B .. 'workers'
local K_STATS, K_DEADLINES, K_LANES = B .. 'stats', B .. 'deadlines', B .. 'lanes'
local K_HANDED = B .. 'handed'

local function task_key(id) return B .. 'task:' .. id end
local function queue_key(p, m) return B .. 'q:' .. p .. ':' .. m end
local function index_key(p) return B .. 'models:' .. p end

-- A text as a finite number, or nil: tonumber also reads "nan", "inf" and "1e309".
local function finite(text)
  local n = tonumber(text)
  if n and n > -math.huge and n < math.huge then return n end  -- nan fails both
  return nil
end

-- ARGV[i] as a number in [lo, hi] (an integer with int), or nil. Scripts check every
-- argument before they write: a malformed call is answered {1, 0, reason} (INVALID) and
-- changes nothing, rather than stopping on a Lua error halfway through its writes.
local function arg_num(i, lo, hi, int)
  local n = tonumber(ARGV[i])  -- finite bounds: nan, inf and 1e309 fail them
  if n and n >= lo and n <= hi and (not int or n == math.floor(n)) then return n end
  return nil
end

-- ARGV[i] as a result TTL (ms): up to 13 digits (317 years) without a leading zero, kept as
-- text as PEXPIRE takes it (it refuses "0123"); nil for anything else.
local function ttl_arg(i)
  local t = ARGV[i]
  if t and #t <= 13 and (t == '0' or string.find(t, '^[1-9]%d*$')) then return t end
  return nil
end

-- A priority as its level's text ("0".."3"; from text or a number), or nil.
local function level(p)
  p = tostring(p)
  if p == '0' or p == '1' or p == '2' or p == '3' then return p end
  return nil
end

-- ARGV "0" or "" means: use the server's clock, so hosts with skewed clocks agree; else an
-- integer ms up to 1e15 (the year 33658). nil for anything else (callers answer INVALID).
local function clock(arg)
  local n = arg == '' and 0 or finite(arg)
  if n == 0 then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  if n and n > 0 and n <= 1e15 and n == math.floor(n) then return n end
  return nil
end

local function ms(n) return string.format('%d', n) end

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

-- Strict JSON check: the server's cjson also accepts hex numbers, nan and inf, which JSON
-- readers reject. Its leniency is a VM-wide setting, so it is restored afterwards.
local function is_json(text)
  local set = cjson.decode_invalid_numbers  -- absent in some embedded servers (already strict)
  local prev = set and set()
  if set then set(false) end
  local ok = pcall(cjson.decode, text)
  if set then set(prev) end
  return ok
end

-- Keep the index score of (p, m) equal to its queue's head score; drop it when empty.
local function refresh_head(p, m)
  local head = redis.call('ZRANGE', queue_key(p, m), 0, 0, 'WITHSCORES')
  if head[1] then
    redis.call('ZADD', index_key(p), head[2], m)
  else
    redis.call('ZREM', index_key(p), m)
  end
end

-- The task worker w is reserved for ("<task> <expires ms>" in reserve:<w>), if the
-- reservation has not expired by now. The expiry is in the value, not the key's TTL, so a
-- replay on a virtual clock sees it end at the same virtual time however fast it runs.
local function reserved_task(w, now)
  local v = redis.call('GET', B .. 'reserve:' .. w)
  if not v then return nil, false end
  local id, at = string.match(v, '^(%S+) (%d+)$')
  if id and tonumber(at) > now then return id, true end
  return nil, true
end

-- A waiting task that starts or ends no longer needs the room the planner made for it:
-- the reservation it holds on worker w (its reserved_for) is dropped, and the request to
-- the victim asked to yield for it (its yield_victim), if that still runs and has not
-- yielded, is withdrawn: taken off its worker's control list if not read yet, else undone
-- by "unyield" (the list is popped newest first, so it must not overtake its "yield").
local function withdraw_yield(id, w, victim, now)
  if not w or w == '' then return end
  redis.call('HDEL', task_key(id), 'reserved_for', 'yield_victim')
  if reserved_task(w, now) == id then redis.call('DEL', B .. 'reserve:' .. w) end
  if not victim or victim == '' then return end
  local v = redis.call('HMGET', task_key(victim), 'state', 'yield_for', 'worker', 'priority')
  if v[1] ~= 'running' or v[2] ~= id then return end
  redis.call('HDEL', task_key(victim), 'yield_by', 'yield_for')
  redis.call('HINCRBY', K_STATS, 'preempt:withdrawn', 1)
  if level(v[4]) then redis.call('HINCRBY', K_STATS, 'preempt:withdrawn:P' .. v[4], 1) end
  local ctl = B .. 'ctl:' .. v[3]
  for _, msg in ipairs(redis.call('LRANGE', ctl, 0, -1)) do
    if string.sub(msg, 1, 7 + #victim) == 'yield ' .. victim .. ' ' then
      redis.call('LREM', ctl, 1, msg)
      return
    end
  end
  redis.call('LPUSH', ctl, 'unyield ' .. victim)
end

local function wake_worker(w)
  redis.call('ZREM', K_IDLE, w)
  redis.call('LPUSH', B .. 'wake:' .. w, '1')
end

-- One entry per task left unwoken (up to 16), so as many idle workers can wake.
local function wake_pool(count)
  -- the list is full most of the time nobody idles: then nothing is pushed
  local room = 16 - redis.call('LLEN', K_WAKE)
  for _ = 1, math.min(count or 1, room) do redis.call('LPUSH', K_WAKE, '1') end
end

-- Whether worker w serves priority p: only dedicated lanes are listed in `lanes`.
local function serves(w, p)
  local levels = redis.call('HGET', K_LANES, w)
  return not levels or string.find(levels, tostring(p), 1, true) ~= nil
end

-- An idle worker other than `except` that holds model m, serves priority p and whose
-- claimable VRAM (its idle score) covers the need; a holder without room would wake only
-- to find nothing.
local function idle_holder(m, need, except, p)
  local holders = redis.call('SMEMBERS', B .. 'holders:' .. m)
  table.sort(holders)  -- a set's order varies between server runs; decisions must not
  for _, w in ipairs(holders) do
    if w ~= except then
      local score = redis.call('ZSCORE', K_IDLE, w)
      if score and tonumber(score) >= need and serves(w, p) then return w end
    end
  end
  return nil
end

-- The idle worker other than `except` serving priority p with the least claimable VRAM in
-- [need, upper] (among the 8 tightest: lanes are few); with `unoccupied`, only one running
-- no task (a worker with free slots stays in `idle` while it runs others).
local function tightest(need, upper, except, p, unoccupied)
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', K_IDLE, need, upper, 'LIMIT', 0, 8)) do
    if w ~= except and serves(w, p)
        and not (unoccupied and redis.call('SCARD', B .. 'worker:' .. w .. ':tasks') > 0) then
      return w
    end
  end
  return nil
end

-- The busy workers other than `except` that hold model m, serve priority p and are large
-- enough for need (each claims its held models first once it frees up), in a fixed order.
local function busy_holders_of(m, need, p, except)
  local out = {}
  local holders = redis.call('SMEMBERS', B .. 'holders:' .. m)
  table.sort(holders)  -- a set's order varies between server runs; decisions must not
  for _, w in ipairs(holders) do
    if w ~= except and not redis.call('ZSCORE', K_IDLE, w) then
      local g = redis.call('HMGET', B .. 'worker:' .. w, 'vram_total_gb', 'kv_reserve_gb', 'levels')
      if finite(g[1]) and finite(g[1]) - (finite(g[2]) or 0) >= need
          and string.find(g[3] or '0123', tostring(p), 1, true) then
        out[#out + 1] = w
      end
    end
  end
  return out
end

-- A busy holder of model m running a preemptible task of lower priority than p: the
-- reaper's planner may ask that task to yield, so online work starts on a GPU that has
-- its model instead of loading it cold elsewhere.
local function yielding_holder(m, need, p)
  for _, w in ipairs(busy_holders_of(m, need, p, nil)) do
    for _, t in ipairs(redis.call('SMEMBERS', B .. 'worker:' .. w .. ':tasks')) do
      local r = redis.call('HMGET', task_key(t), 'priority', 'preemptible')
      if r[2] == '1' and level(r[1]) and tonumber(r[1]) > tonumber(p) then return w end
    end
  end
  return nil
end

-- The worker best placed for a task, while any worker idles: an idle worker holding its
-- model; for online and nearline work, else a busy holder whose lower-priority task may be
-- asked to yield (not woken: the reaper's planner acts on the offer, and idle workers leave
-- the task to it until the offer's deferral ends, then load it cold); else the idle worker
-- it fits most tightly. With no worker idle the planner weighs every running task, as for
-- any task that fits no idle worker. Returns that worker (or nil), whether it idles and
-- whether it holds the model (only an idle holder with room is picked for holding it).
-- idle_n: the idle set's size.
local function pick(m, need, p, idle_n)
  idle_n = idle_n or redis.call('ZCARD', K_IDLE)
  if idle_n == 0 then return nil, false, false end
  local w = idle_holder(m, need, nil, p)
  if w then return w, true, true end
  if p == '0' or p == '1' then
    local busy = yielding_holder(m, need, p)
    if busy then return busy, false, true end
  end
  w = tightest(need, '+inf', nil, p)
  if not w then return nil, false, false end
  return w, true, false
end

-- Offer a task to the worker `pick` finds, and wake it if it idles. Returns the worker
-- offered to (or nil) and whether it was woken. A woken worker leaves the idle set until it
-- finds nothing to claim, so a burst of enqueues spreads over idle workers. Callers also
-- post a pool-wide wake when no worker was woken, or (while others idle) in case the woken
-- one died idle.
local function wake(m, need, p, idle_n)
  local w, idle = pick(m, need, p, idle_n)
  if idle then wake_worker(w) end
  return w, idle
end

-- An idle worker's hand-over settings, from its hash, if it takes tasks handed over at
-- enqueue (one slot, blocked on its wake list): its defer bound, fair_every and lease (ms).
-- nil otherwise: a worker with more slots is woken instead (its other runners are reached
-- only while it is listed idle, which a hand-over ends), and so is a burst worker.
local function handover(w)
  local h = redis.call('HMGET', B .. 'worker:' .. w, 'concurrency', 'handover_defer_ms', 'fair_every',
    'lease_ms')
  local defer, fair_every, lease = finite(h[2]), finite(h[3]), finite(h[4])
  if h[1] ~= '1' or not (defer and fair_every and lease) then return nil end
  return {defer = defer, fair_every = fair_every, lease = lease}
end

-- Remember a missed SLA for `gpuq top` (newest first, the last 100).
local function note_miss(id, p, m, wait_ms, now, kind)
  redis.call('LPUSH', B .. 'misses', cjson.encode({id = id, priority = 'P' .. p, model = m,
    wait_s = wait_ms / 1000, at = now / 1000, kind = kind}))
  redis.call('LTRIM', B .. 'misses', 0, 99)
end

-- Start task id on worker w: a fresh fencing token, its lease (until lease_until), the
-- worker's task set, and for a first attempt the SLA count (started by its start-by score
-- or not). Claim and enqueue's hand-over share it. Returns the token.
local function start(id, p, m, w, now, lease_until, attempt, score, enqueued_at)
  local token = redis.call('INCR', B .. 'token')
  redis.call('HSET', task_key(id), 'state', 'running', 'worker', w, 'token', token,
    'attempt', attempt, 'started_at', ms(now), 'error', '')
  redis.call('ZADD', K_RUNNING, lease_until, id)
  redis.call('SADD', B .. 'worker:' .. w .. ':tasks', id)
  if attempt == '1' then
    if now <= tonumber(score) then
      redis.call('HINCRBY', K_STATS, 'sla_met:P' .. p, 1)
    else
      redis.call('HINCRBY', K_STATS, 'sla_missed:P' .. p, 1)
      note_miss(id, p, m, now - tonumber(enqueued_at), now, 'late')
    end
  end
  return token
end

-- The catalog's mean measured load time of model m (ms; 0 before its first load).
local function mean_load_ms(m)
  local c = redis.call('HMGET', B .. 'model:' .. m, 'loads', 'total_load_s')
  local loads, total = finite(c[1]) or 0, finite(c[2]) or 0
  if loads < 1 or total < 0 then return 0 end
  return math.floor(total / loads * 1000)
end

-- A cold start (the worker loads the task's model first): note when the model should be
-- loaded, by its mean measured load (nothing before its first load). The preemption
-- planner counts a victim's runtime and end from there: asking a task to yield while it
-- loads would throw the load away (it yields only once its handler runs).
local function note_cold_start(id, m, now)
  local load = mean_load_ms(m)
  if load > 0 then redis.call('HSET', task_key(id), 'ready_at', ms(now + load)) end
end

-- Fairness after a dispatch at level p: its debt is paid; each lower level with work saw
-- one more higher dispatch (fair: the `fair` hash's values for levels 1..3).
local function count_dispatch(p, fair, fair_every)
  if p > 0 and finite(fair[p]) ~= 0 then redis.call('HSET', B .. 'fair', tostring(p), '0') end
  for q = p + 1, 3 do
    if redis.call('EXISTS', index_key(q)) == 1 and (finite(fair[q]) or 0) < fair_every then
      redis.call('HINCRBY', B .. 'fair', tostring(q), 1)
    end
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
  redis.call('ZADD', index_key(p), 'LT', score, m)
  redis.call('ZADD', K_NEED, need, id)
end

-- Take a queued task out of its queue and the indexes (the deadline index unless the
-- caller knows the task has no deadline).
local function unqueue(id, p, m, has_deadline)
  redis.call('ZREM', queue_key(p, m), id)
  refresh_head(p, m)
  redis.call('ZREM', K_NEED, id)
  if has_deadline ~= false then redis.call('ZREM', K_DEADLINES, id) end
end

local function release(id, worker)
  redis.call('ZREM', K_RUNNING, id)
  if worker and worker ~= '' then redis.call('SREM', B .. 'worker:' .. worker .. ':tasks', id) end
end

-- End a task: terminal state, wake its waiters, keep it readable for ttl ms; counted per
-- state and per state and priority ("<state>:P<n>"; p read from the task unless given).
local function finish(id, state, now, ttl, field, value, p)
  local tk = task_key(id)
  redis.call('HSET', tk, 'state', state, 'finished_at', ms(now), field, value)
  p = level(p or redis.call('HGET', tk, 'priority'))  -- none in a corrupt hash
  if p then redis.call('HINCRBY', K_STATS, state .. ':P' .. p, 1) end
  local done = B .. 'done:' .. id
  redis.call('LPUSH', done, state)
  redis.call('PEXPIRE', done, ttl)
  redis.call('PEXPIRE', tk, ttl)
  redis.call('HINCRBY', K_STATS, state, 1)
  -- a task made from an RQ job that ends without its handler's word (canceled, expired, a
  -- lost last attempt, a handler missing) is listed for the rq bridge to tell RQ
  if state ~= 'succeeded' and redis.call('HGET', tk, 'handler') == 'rq.job' then
    redis.call('LPUSH', B .. 'rq:ended', id)
  end
end

-- End a task whose hash is corrupt (`defect`): failed, with the field in its error, and out
-- of its queue (when its priority and model name one) and the indexes.
local function fail_corrupt(id, field, p, m, now, ttl)
  if type(p) == 'string' and type(m) == 'string' then
    unqueue(id, p, m)
  else
    redis.call('ZREM', K_NEED, id)
    redis.call('ZREM', K_DEADLINES, id)
  end
  finish(id, 'failed', now, ttl, 'error', corrupt(field))
end

-- Put a stored task back into its queue at its stored score, and wake a worker for it.
-- Returns "queued", or "failed" for a corrupt hash (`fail_corrupt`, kept for ttl ms).
local function push(id, now, ttl)
  local f = redis.call('HMGET', task_key(id), 'priority', 'model', 'score', 'vram_gb', 'deadline', 'est_s')
  local bad = defect(f[1], f[2], f[4], f[6], f[3], f[5])
  if bad then
    fail_corrupt(id, bad, f[1], f[2], now, ttl)
    return 'failed'
  end
  index(id, f[1], f[2], f[3], f[4])
  watch_deadline(id, f[5], f[6])
  local idle_n = redis.call('ZCARD', K_IDLE)
  local offered, woken = wake(f[2], tonumber(f[4]), f[1], idle_n)
  redis.call('HSET', task_key(id), 'offered', offered or '')
  -- a woken worker has left the idle set: a pool-wide wake too while others remain
  if not woken or idle_n > 1 then wake_pool(1) end
  return 'queued'
end

-- Running task back to its queue (lost lease, shutdown, yield). consume=false gives the
-- attempt back. Fails it for good once a lost lease has used its last attempt, or when its
-- attempt counts are corrupt.
local function requeue(id, now, reason, consume, ttl)
  local tk = task_key(id)
  local f = redis.call('HMGET', tk, 'worker', 'attempt', 'max_attempts', 'priority', 'model')
  release(id, f[1])
  redis.call('HDEL', tk, 'yield_by', 'yield_for')
  local attempt, tries = finite(f[2]), finite(f[3])
  if not (attempt and attempt == math.floor(attempt) and tries) then
    fail_corrupt(id, attempt and 'max_attempts' or 'attempt', f[4], f[5], now, ttl)
    return 'failed'
  end
  if consume and attempt >= tries then
    finish(id, 'failed', now, ttl, 'error', reason .. ' (after ' .. f[2] .. ' attempts)')
    return 'failed'
  end
  if not consume then attempt = attempt - 1 end
  redis.call('HSET', tk, 'state', 'queued', 'worker', '', 'token', '', 'error', reason,
    'queued_at', ms(now), 'ready_at', '', 'attempt', ms(attempt))
  return push(id, now, ttl)
end

-- The wake list entry of task id handed over to worker w, while the worker has not popped it.
local function unread_handover(w, id)
  for _, msg in ipairs(redis.call('LRANGE', B .. 'wake:' .. w, 0, -1)) do
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
-- deadline of those still unread in time (nil if none).
local function reclaim_handed(now, limit, ttl)
  local pending
  local entries = redis.call('ZRANGE', K_HANDED, 0, limit - 1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    local id, at = entries[i], tonumber(entries[i + 1])
    local f = redis.call('HMGET', task_key(id), 'state', 'worker')
    local msg = f[1] == 'running' and f[2] and unread_handover(f[2], id)
    if msg and at > now then
      pending = math.min(pending or at, at)
    else
      redis.call('ZREM', K_HANDED, id)
      if msg then
        redis.call('LREM', B .. 'wake:' .. f[2], 1, msg)
        requeue(id, now, 'its worker did not pick it up', false, ttl)
      end
    end
  end
  return pending
end

-- Move retries whose backoff has passed back into their queues (bounded per call; ttl: how
-- long one failed for a corrupt hash stays readable).
local function promote_due(now, limit, ttl)
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', now, 'LIMIT', 0, limit)
  for _, id in ipairs(due) do
    redis.call('ZREM', K_DELAYED, id)
    if redis.call('EXISTS', task_key(id)) == 1 then  -- a hash deleted meanwhile: nothing to run
      redis.call('HSET', task_key(id), 'state', 'queued', 'queued_at', ms(now))
      push(id, now, ttl)
    end
  end
  return #due
end
