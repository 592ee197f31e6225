-- lib/wake.lua: the wake rule: which worker a task is offered to, and wake-ups.

--@include lanes
--@include few_idle
--@include holders

-- token: "1", or "look" for a worker woken as its shape's lookout (lib/lookout.lua)
local function wake_worker(w, token)
  redis.call('ZREM', K_IDLE, w)
  redis.call('LPUSH', wake_key(w), token or '1')
end

-- One entry per task left unwoken (up to 16), so as many idle workers can wake.
local function wake_pool(count)
  -- the list is full most of the time nobody idles: then nothing is pushed
  local room = 16 - redis.call('LLEN', K_POOL_WAKE)
  for _ = 1, (count or 1) < room and (count or 1) or room do redis.call('LPUSH', K_POOL_WAKE, '1') end
end

-- Whether worker w's group has `gpus` devices: read only for a task asking for more than one.
local function has_gpus(w, gpus)
  return gpus <= 1 or (tonumber(redis.call('HGET', worker_key(w), 'gpus')) or 1) >= gpus
end

-- An idle worker other than `except` that holds model m, serves priority p, does not skip m
-- at time now (a holding listed while its load failed later: an eviction whose report was
-- lost), has the task's `gpus` devices and whose claimable VRAM (its idle score) covers the
-- need: the tightest fit (ZINTER's order: score, then name; a one-GPU task leaves an idle
-- group to work only it can run) among the first 64 with room (lanes read in one HMGET).
local function idle_holder(m, need, except, p, gpus, now)
  local got, fit = idle_holders(m, p), {}
  for i = 1, #got, 2 do
    if got[i] ~= except and tonumber(got[i + 1]) >= need then fit[#fit + 1] = got[i] end
  end
  if not fit[1] then return nil end
  local n = math.min(#fit, 64)
  local lanes = redis.call('HMGET', K_LANES, unpack(fit, 1, n))
  for i = 1, n do
    if lane_serves(lanes[i], p, m, now) and has_gpus(fit[i], gpus) then
      return fit[i]
    end
  end
  return nil
end

-- The first of idle workers `ws` (in the caller's order) that may be offered a task (see
-- tightest), their lanes read in one HMGET; nil when none.
local function first_taker(ws, except, p, unoccupied, gpus, m, now)
  local lanes = ws[1] and redis.call('HMGET', K_LANES, unpack(ws)) or {}
  for i, w in ipairs(ws) do
    if w ~= except and lane_serves(lanes[i], p, m, now) and has_gpus(w, gpus)
        and not (unoccupied and redis.call('SCARD', worker_tasks_key(w)) > 0) then return w end
  end
end

-- Online work the tightest idle workers all passed over (lanes of other levels, as many as
-- were read): the idle workers serving p (`serving:<p>`), in score order, the first 8 in
-- [need, upper] weighed. One ZINTER, O(the smaller of `idle` and the serving set); batch work
-- is left to the pool's wake list instead, which an idle lane of another level may pop and
-- find nothing in: a wait of an idle timeout, within a batch SLA, not an online one.
local function tightest_serving(need, upper, except, p, unoccupied, gpus, m, now)
  local below = upper ~= '+inf' and tonumber(string.sub(upper, 2))  -- upper: '(' .. VRAM
  local got, fit = redis.call('ZINTER', 2, K_IDLE, serving_key(p), 'WEIGHTS', 1, 0, 'WITHSCORES'), {}
  for i = 1, #got, 2 do
    local s = tonumber(got[i + 1])
    if #fit == 8 or (below and s >= below) then break end
    if s >= need then fit[#fit + 1] = got[i] end
  end
  return first_taker(fit, except, p, unoccupied, gpus, m, now)
end

-- The idle worker other than `except` serving priority p, with `gpus` devices, not skipping
-- model m at time now (m nil: any), with the least claimable VRAM in [need, upper] (among
-- the 8 tightest: lanes are few; for a task on several GPUs, 64, then the 8 roomiest:
-- one-GPU workers with room must not hide a group; online work read past by lanes of other
-- levels: tightest_serving); with `unoccupied`, only one running no task (one with free
-- slots stays in `idle` while it runs others). A group's VRAM spans its devices: one-GPU
-- work leaves a four-GPU group free.
-- Their lanes come in one HMGET: idle online lanes sit among them for every P2 enqueue.
--@calls ZRANGEBYSCORE ZREVRANGEBYSCORE (named in `reads`: gpuq/acl.py grants them)
local function tightest(need, upper, except, p, unoccupied, gpus, m, now)
  local reads = gpus > 1 and {{64, 'ZRANGEBYSCORE', need, upper}, {8, 'ZREVRANGEBYSCORE', upper, need}}
    or {{8, 'ZRANGEBYSCORE', need, upper}}
  for _, r in ipairs(reads) do
    local got = redis.call(r[2], K_IDLE, r[3], r[4], 'LIMIT', 0, r[1])
    local w = first_taker(got, except, p, unoccupied, gpus, m, now)
    if w then return w end
    if #got < r[1] then return nil end  -- every idle worker in range was looked at
  end
  if tonumber(p) <= 1 and redis.call('HLEN', K_LANES) > 0 then  -- p: a number in claim.lua
    return tightest_serving(need, upper, except, p, unoccupied, gpus, m, now)
  end
end

-- The worker best placed for a task, while any worker idles: an idle worker holding its
-- model; for online and nearline work, else a busy holder whose lower-priority task may be
-- asked to yield (not woken: the reaper's planner acts on the offer, and idle workers leave
-- the task to it until the offer's deferral ends, then load it cold); else the idle worker
-- it fits most tightly. With no worker idle the planner weighs every running task, as for
-- any task that fits no idle worker. Returns that worker (or nil), whether it idles and
-- whether it holds the model (only an idle holder with room is picked for holding it).
-- idle_n: the idle set's size; gpus: the devices the task runs across; now: ms.
local function pick(m, need, p, idle_n, gpus, now)
  idle_n = idle_n or redis.call('ZCARD', K_IDLE)
  if idle_n == 0 then return nil, false, false end
  local few, w, fit = gpus <= 1 and idle_n <= 8, nil, nil
  if few then w, fit = pick_few(m, need, p, now) else w = idle_holder(m, need, nil, p, gpus, now) end
  if w then return w, true, true end
  if p == '0' or p == '1' then
    local busy = yielding_holder(m, need, p, gpus)
    if busy then return busy, false, true end
  end
  if few then w = fit else w = tightest(need, '+inf', nil, p, false, gpus, m, now) end
  if not w then return nil, false, false end
  return w, true, false
end

-- Offer a task to the worker `pick` finds, and wake it if it idles. Returns the worker
-- offered to (or nil) and whether it was woken. A woken worker leaves the idle set until it
-- finds nothing to claim, so a burst of enqueues spreads over idle workers. Callers also
-- post a pool-wide wake when no worker was woken, or (while others idle) in case the woken
-- one died idle.
local function wake(m, need, p, idle_n, gpus, now)
  local w, idle = pick(m, need, p, idle_n, gpus, now)
  if idle then wake_worker(w) end
  return w, idle
end
