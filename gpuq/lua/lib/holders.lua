-- lib/holders.lua: a model's busy holders: which could take a task, which runs a task that
-- may yield. A few commands a question, however many workers hold the model
-- (docs/DECISIONS.md, Bounded work).

--@include args
--@include lanes

-- Model m's idle holders and their idle scores (claimable VRAM), in score order: one ZINTER of
-- `idle` and the holders set, in C, rather than a ZSCORE per holder. With priority p, while
-- any worker is a lane, only those serving p (`serving:<p>`, a third input): idle online lanes
-- holding the model would otherwise come back for every batch task, to be passed over.
local function idle_holders(m, p)
  if p and redis.call('HLEN', K_LANES) > 0 then
    return redis.call('ZINTER', 3, K_IDLE, holders_key(m), serving_key(p), 'WEIGHTS', 1, 0, 0,
      'WITHSCORES')
  end
  return redis.call('ZINTER', 2, K_IDLE, holders_key(m), 'WEIGHTS', 1, 0, 'WITHSCORES')
end

-- The busy workers other than `except` that hold model m, serve priority p and are large
-- enough for need on `gpus` devices (each claims its held models first once it frees up): the
-- first 16 busy holders, those not in `idle` by name (bytes; one ZDIFF, sorted in C), then
-- those in `idle` running tasks whose score (what their free slots may claim) is under the
-- need: a worker with slots left stays in `idle` while it runs tasks, whose VRAM it frees as
-- they end (one running none that did not take the task has no room for it).
-- Their capacities (`capacities`: written at registration, removed at departure) come in one
-- HMGET. A worker with no entry there (registered by an older gpuq) is read from its hash.
local function busy_holders_of(m, need, p, except, gpus)
  local busy, out = {}, {}
  for _, w in ipairs(redis.call('ZDIFF', 2, holders_key(m), K_IDLE)) do
    if #busy >= 16 then break end
    if w ~= except then busy[#busy + 1] = w end
  end
  if #busy < 16 then
    local idle = idle_holders(m)
    for i = 1, #idle, 2 do
      if #busy >= 16 or tonumber(idle[i + 1]) >= need then break end
      if idle[i] ~= except and redis.call('SCARD', worker_tasks_key(idle[i])) > 0 then
        busy[#busy + 1] = idle[i]
      end
    end
  end
  if not busy[1] then return out end
  local caps = redis.call('HMGET', K_CAPACITIES, unpack(busy))
  for i, w in ipairs(busy) do
    local usable, n, levels = string.match(caps[i] or '', '^(%S+) (%S+) (%S+)$')
    if not usable then
      local g = redis.call('HMGET', worker_key(w), 'vram_total_gb', 'kv_reserve_gb', 'levels', 'gpus')
      usable, n, levels = finite(g[1]) and finite(g[1]) - (finite(g[2]) or 0), g[4], g[3]
    end
    usable = finite(usable)
    if usable and usable >= need and lane_serves(levels, p) and (tonumber(n) or 1) >= gpus then
      out[#out + 1] = w
    end
  end
  return out
end

-- The next task of `holders` (busy_holders_of) after place `at` ({h = 0, t = 0, ids = {}} at
-- first: holder and task indexes, the holder's tasks), and its holder; nil when none is left.
-- A holder's task set is read when the walk reaches it: a caller that stops early reads no
-- more, and one that keeps `at` resumes where it stopped.
local function next_task(holders, at)
  while not at.ids[at.t + 1] do
    if not holders[at.h + 1] then return nil end
    at.h, at.t = at.h + 1, 0
    at.ids = redis.call('SMEMBERS', worker_tasks_key(holders[at.h]))
  end
  at.t = at.t + 1
  return at.ids[at.t], holders[at.h]
end

-- A busy holder of model m running a preemptible task of lower priority than p: the
-- reaper's planner may ask that task to yield, so online work starts on a GPU that has
-- its model instead of loading it cold elsewhere.
local function yielding_holder(m, need, p, gpus)
  local holders, at = busy_holders_of(m, need, p, nil, gpus), {h = 0, t = 0, ids = {}}
  local t, w = next_task(holders, at)
  while t do
    local r = redis.call('HMGET', task_key(t), 'priority', 'preemptible')
    if r[2] == '1' and level(r[1]) and tonumber(r[1]) > tonumber(p) then return w end
    t, w = next_task(holders, at)
  end
  return nil
end
