-- claim.lua: give a worker the best task it can run now, under a lease, in one atomic call.
--
-- First, a reservation the preemption planner made for this worker (reserve:<worker>, until its
-- expiry): its task is claimed as soon as it fits; until then the worker takes nothing else. Then,
-- in order: levels starved by the fairness rule first (a level below P0 that has seen fair_every
-- dispatches of higher levels since its own last one), then P0..P3. Within a level: the worker's
-- loaded models first (no cold start), then the other models with work in head-score order (oldest
-- / earliest start-by first). A task fits when its VRAM need minus the loaded model's footprint
-- fits free VRAM plus the worker's other idle models (model held), or when its whole need fits free
-- plus evictable VRAM (model not held). A cold task is left for a better-placed worker (the one
-- enqueue offered it to and woke, an idle one holding its model with room for it, or one it fits
-- more tightly) until it has waited defer ms; that worker is woken, and this one told when to look
-- again. Batch work (P2/P3) also waits, up to the holder wait, for busy workers that hold its model
-- when they would get to it within that wait (a cold load costs tens of seconds). A task too big
-- for this worker wakes the tightest idle worker that fits it. Cost: O(levels x models-with-work x
-- scan x log N); no backlog scan.
--
-- KEYS[1]  pool key base
-- ARGV[1]  worker id
-- ARGV[2]  now (ms; "0" = server clock)
-- ARGV[3]  free VRAM (GB): total - KV reserve - loaded models - running tasks' working memory
-- ARGV[4]  evictable VRAM (GB): footprint of loaded models no running task uses
-- ARGV[5]  free slots (>= 1)
-- ARGV[6]  lease (ms)
-- ARGV[7]  fair_every (N: one lower dispatch after N higher ones)
-- ARGV[8]  levels this worker serves, e.g. "0123"
-- ARGV[9]  tasks examined per (priority, model) queue
-- ARGV[10..13]  defer bound of P0..P3 (ms)
-- ARGV[14..17]  holder wait of P0..P3 (ms): how long a cold task waits for a busy GPU that
--               holds its model (0: not at all)
-- ARGV[18..]  pairs: loaded model name, its footprint (GB)
-- Returns  {0, "none", retry_ms}            nothing this worker can run; it is marked idle.
--                                            retry_ms > 0: a task was left for another
--                                            worker and may be claimed after that long
--          {0, "task", field, value, ...}   the claimed task: id, token, handler, payload,
--                                            model, vram_gb, priority, est_s, attempt,
--                                            deadline, tenant, checkpoint, enqueued_at,
--                                            queued_at, started_at (ms)
-- A first attempt counts in stats as sla_met:P<n> or sla_missed:P<n> (started by its queue
-- score, the start-by time, or not); a miss is also noted in `misses` for gpuq top.

local worker, now = ARGV[1], clock(ARGV[2])
local free, evictable, slots = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local lease, fair_every, levels = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local scan = tonumber(ARGV[9])
local defer = {tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])}
local hold = {tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16]), tonumber(ARGV[17])}
local held, held_names = {}, {}
for i = 18, #ARGV, 2 do
  held[ARGV[i]] = tonumber(ARGV[i + 1])
  held_names[#held_names + 1] = ARGV[i]
end
local claimable = free + evictable

-- Room for a task of a model this worker holds (footprint GB): free VRAM plus the other idle
-- models, which the worker evicts for it as for a cold load (its ModelCache does the same).
-- evictable counts the held model too while it is idle; while a running task uses it, the
-- difference undercounts, which is safe.
local function held_room(footprint)
  return free + math.max(0, evictable - footprint)
end

promote_due(now, 20)
local unread_until = reclaim_handed(now, 8)

-- Workers a skipped task is passed on to: the better-placed worker a cold task was left
-- for is woken (it may be blocked), and so is one that fits a task too big for this one.
local pass_to, unfit_need, unfit_p, retry = {}, nil, nil, nil

-- The idle worker better placed than this one for a cold task, if any: one holding its
-- model, or one it fits more tightly that runs nothing (a worker with free slots left in
-- `idle` would be handed a whole burst while it takes one task per free slot).
local function better_elsewhere(m, need, p)
  return idle_holder(m, need, worker, p) or tightest(need, '(' .. claimable, worker, p, true)
end

-- How many busy holders of model m could take the task (busy_holders_of), and in how many
-- seconds the first of them expects to free up, by its tasks' estimates (an overrun one
-- counts as ending now). An idle holder that did not take the task has no room.
local function busy_holders(m, need, p)
  local n, soonest = 0, math.huge
  for _, w in ipairs(busy_holders_of(m, need, p, worker)) do
    n = n + 1
    for _, t in ipairs(redis.call('SMEMBERS', B .. 'worker:' .. w .. ':tasks')) do
      local r = redis.call('HMGET', task_key(t), 'started_at', 'est_s')
      if r[1] and r[2] then
        soonest = math.min(soonest, math.max(0, tonumber(r[1]) + tonumber(r[2]) * 1000 - now) / 1000)
      end
    end
  end
  return n, soonest == math.huge and 0 or soonest
end

-- Whether the k-th task of queue (p, m) is better left for m's busy holders: the first of
-- them frees up, then they take the queue's tasks in turn (each about est_s long, as this
-- one), and would reach it within the left_s seconds it may still wait. Batch work prefers
-- waiting within its bound to a cold load; waiting for a holder that frees up only after
-- the bound is pure loss, since the task would be loaded cold then anyway.
local function wait_for_holders(m, need, p, k, est_s, left_s)
  local n, free_in = busy_holders(m, need, p)
  return n > 0 and free_in + math.floor((k - 1) / n) * est_s <= left_s
end

-- First task of queue (p, m) this worker can run, with the VRAM it will use.
local function scan_queue(p, m)
  local footprint = held[m]
  local ids = redis.call('ZRANGE', queue_key(p, m), 0, scan - 1)
  for k, id in ipairs(ids) do
    local f = redis.call('HMGET', task_key(id), 'vram_gb', 'queued_at', 'offered', 'est_s')
    local need = tonumber(f[1])
    if footprint and need - footprint <= held_room(footprint) then
      return id, math.max(0, need - footprint)
    elseif not footprint and need <= claimable then
      local waited = now - tonumber(f[2])
      local left = defer[p + 1] - waited
      local offered = f[3] and f[3] ~= '' and f[3] ~= worker  -- a missing field reads false
      local better = left > 0 and (offered or better_elsewhere(m, need, p))
      if better then
        if better ~= true then pass_to[better] = true end
        retry = math.min(retry or left, left)
        return nil
      end
      -- batch work waits longer for a busy GPU holding its model than pay a cold load here,
      -- while the holders would get to it within its holder wait; later tasks of a deep
      -- backlog are taken here
      left = hold[p + 1] - waited
      if not (left > 0 and wait_for_holders(m, need, p, k, tonumber(f[4]), left / 1000)) then
        return id, need
      end
      retry = math.min(retry or left, left)
    elseif not unfit_need then
      unfit_need, unfit_p = need, p
    end
  end
  return nil
end

local PAGE = 16
-- Held models first, then the others in head-score order, a page of the index at a time.
local function find(p)
  local idx = index_key(p)
  local page = redis.call('ZRANGE', idx, 0, PAGE - 1)
  if not page[1] then return nil end
  for _, m in ipairs(held_names) do
    if redis.call('ZSCORE', idx, m) then
      local id, use = scan_queue(p, m)
      if id then return id, m, use end
    end
  end
  local start = 0
  while page[1] do
    for _, m in ipairs(page) do
      if not held[m] then
        local id, use = scan_queue(p, m)
        if id then return id, m, use end
      end
    end
    start = start + PAGE
    page = #page == PAGE and redis.call('ZRANGE', idx, start, start + PAGE - 1) or {}
  end
  return nil
end

local serves = {}
for p = 0, 3 do serves[p] = string.find(levels, tostring(p), 1, true) ~= nil end
local fair = redis.call('HMGET', B .. 'fair', '1', '2', '3')
local order = {}
for p = 1, 3 do
  if tonumber(fair[p] or 0) >= fair_every then order[#order + 1] = p end
end
for p = 0, 3 do order[#order + 1] = p end

local id, p, m, use
local reserved, has_key = reserved_task(worker, now)
if reserved then
  local f = redis.call('HMGET', task_key(reserved), 'state', 'priority', 'model', 'vram_gb')
  if f[1] == 'queued' then
    local need, footprint = tonumber(f[4]), held[f[3]]
    if footprint and need - footprint <= held_room(footprint) then
      use = math.max(0, need - footprint)
    elseif not footprint and need <= claimable then
      use = need
    else
      -- the task it waits for still holds the room: take nothing else, look again soon
      redis.call('ZREM', K_IDLE, worker)
      return {0, 'none', 200}
    end
    id, p, m = reserved, tonumber(f[2]), f[3]
  end
end
if has_key then  -- used, moot (claimed elsewhere, ended) or expired
  redis.call('DEL', B .. 'reserve:' .. worker)
end

local starved = #order - 4
for i, level in ipairs(order) do
  if id then break end
  if serves[level] then
    id, m, use = find(level)
    if id then
      p = level
      if i <= starved then redis.call('HINCRBY', K_STATS, 'fair:P' .. p, 1) end
    end
  end
end

for w in pairs(pass_to) do wake_worker(w) end
if not id then
  if unfit_need then
    local w = tightest(unfit_need, '+inf', worker, unfit_p)
    if w and not pass_to[w] then wake_worker(w) end
  end
  redis.call('ZADD', K_IDLE, claimable, worker)
  -- a lane is listed where wake-ups look, so tasks it does not serve are not offered to it
  if levels ~= '0123' then redis.call('HSET', K_LANES, worker, levels) end
  -- a task handed over at enqueue and not yet picked up: look again at its deadline, when
  -- a claim takes it back from a worker that died idle
  if unread_until then retry = math.min(retry or math.huge, math.max(1, unread_until - now + 1)) end
  return {0, 'none', retry or 0}
end

count_dispatch(p, fair, fair_every)

local tk = task_key(id)
-- what a worker needs to run the task (the rest stays readable in the hash), read first so
-- the attempt is written with the other fields and the deadline index touched only if needed
local f = redis.call('HMGET', tk, 'handler', 'payload', 'model', 'vram_gb', 'priority', 'est_s',
  'attempt', 'deadline', 'tenant', 'checkpoint', 'enqueued_at', 'queued_at', 'score', 'reserved_for',
  'yield_victim')
unqueue(id, p, m, f[8] and f[8] ~= '')
withdraw_yield(id, f[14], f[15], now)  -- started here: a victim still asked for it keeps running
f[7] = tostring(tonumber(f[7] or 0) + 1)  -- absent before the first start
local token = start(id, p, m, worker, now, now + lease, f[7], f[13], f[11])
if not held[m] then note_cold_start(id, m, now) end
if slots > 1 then
  redis.call('ZADD', K_IDLE, claimable - use, worker)
else
  redis.call('ZREM', K_IDLE, worker)
end
return {0, 'task', 'id', id, 'token', token, 'handler', f[1], 'payload', f[2], 'model', f[3],
  'vram_gb', f[4], 'priority', f[5], 'est_s', f[6], 'attempt', f[7], 'deadline', f[8] or '',
  'tenant', f[9], 'checkpoint', f[10] or '', 'enqueued_at', f[11], 'queued_at', f[12],
  'started_at', ms(now)}
