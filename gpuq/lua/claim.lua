-- claim.lua: give a worker the best task it can run now, under a lease, in one atomic call.
--
-- First, a reservation the preemption planner made for this worker (reserve:<worker>, until its
-- expiry): its task is claimed as soon as it fits; until then the worker takes nothing else. Then,
-- in order: levels starved by the fairness rule first (a level below P0 that has seen fair_every
-- dispatches of higher levels since its own last one), then P0..P3. Within a level: the worker's
-- loaded models first (no cold start), then the other models with work in head-score order (oldest
-- / earliest start-by first); on a loaded model, tasks that can still start by their start-by
-- time go before late ones (candidates). A task fits when its VRAM need minus the loaded model's
-- footprint fits free VRAM plus the worker's other idle models (model held), or when its whole
-- need fits free plus evictable VRAM (model not held), and it asks no more GPUs than the
-- worker's group has (a group shards what it loads over all its devices, so its VRAM is one
-- figure). A cold task is left for a better-placed worker (the one enqueue offered it to and
-- woke, an idle one holding its model with room for it, or one it fits more tightly) until
-- it has waited defer ms; that worker is woken, and this one may be told when to look again.
-- Batch work (P2/P3) also waits, up to the holder wait, for busy workers that hold its model
-- when they would get to it within that wait (a cold load costs tens of seconds). A task too
-- big for this worker wakes the tightest idle worker that fits it. Cost: O(levels x min(models
-- with work, 64 + held) x scan x log N), a model's holders read once (busy ones: 16 at most).
-- KEYS[1]  pool key base
-- ARGV[1]  worker id
-- ARGV[2]  now (ms; "0" = server clock)
-- ARGV[3]  free VRAM (GB): total - KV reserve - loaded models - running tasks' working memory
-- ARGV[4]  evictable VRAM (GB): footprint of loaded models no running task uses
-- ARGV[5]  free slots (>= 1)
-- ARGV[6]  settings, 9 whole numbers in one text: lease (ms), fair_every (one lower dispatch after
--          N higher ones), tasks examined per queue, defer bounds of P0..P3 (ms), holder waits
--          of P2, P3 (ms a cold task waits for a busy GPU holding its model; P0, P1 never wait)
-- ARGV[7]  levels this worker serves, e.g. "0123"
-- ARGV[8]  GPUs in this worker's group (>= 1)
-- ARGV[9]  "1": this worker is its shape's lookout (its last claim replied retry_ms > 0);
--          "2": it is not in `idle` (one slot, and its last claim or a hand-over gave it a task)
-- ARGV[10]  K: its batch handlers (0..1000), then K pairs: handler name, more tasks its batch takes (0..1e4)
-- ARGV[..]  pairs: loaded model name, its footprint (GB), negative while a running task of this
--           worker uses it (then not in the evictable VRAM), "~" first while its load has not
--           ended (its task starts cold); or a model and "skip:<ms>": its load failed here, its
--           queues passed over and `lanes` listing it <ms> more (worker/broken.py; "skip": not listed)
-- Returns  {0, "none", retry_ms}  nothing this worker can run; it is marked idle. retry_ms > 0:
--            a task was left for another worker; this one looks again then (lib/lookout.lua)
--          {0, "task", field, value, ...}  the claimed task: id, token, handler, payload, model,
--            vram_gb, priority, est_s, attempt, deadline, tenant, checkpoint, enqueued_at,
--            queued_at, started_at (ms), sla (below)
--          {0, "task", ..., left_ms, started_at, task, ...}  a batch handler's task on a held model:
--            then what lib/batch.lua took beside it, as claim_batch.lua replies (cold: not tried)
--          {1, 0, reason}  INVALID: a malformed argument (nothing written)
-- A queued task no claim could run wedges nothing: an id whose hash is gone (or no longer queued)
-- leaves its queue; one with a field missing or malformed (`readable`) ends failed, "corrupt task".
-- A task's SLA is decided once, at its first handler start (stats sla_met/sla_missed:P<n>, by its
-- start-by time; a miss noted in `misses`): here for a model held loaded (reply sla "met" or
-- "missed"); "pending" for a cold start (the worker calls began.lua); "" if decided before.

--@include args
--@include queue
--@include corrupt
--@include readable
--@include quota
--@include reserve
--@include wake
--@include holders
--@include start
--@include take
--@include batch
--@include due
--@include lookout

if #ARGV < 10 or #ARGV % 2 == 1 then
  return {1, 0, 'expected 10 arguments, then handler, count and model, footprint pairs'}
end
local worker, now = ARGV[1], clock(ARGV[2])
local free, evictable, slots = arg_num(3, -1e9, 1e9), arg_num(4, 0, 1e9), arg_num(5, 1, 1e6, true)
-- the settings' texts; a level's defer bound and holder wait ([4 + p], [6 + p]) read for a cold task
local settings = {string.match(ARGV[6], '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')}
local lease, fair_every, scan = finite(settings[1]), finite(settings[2]), finite(settings[3])
local levels, gpus, lookout = ARGV[7], arg_num(8, 1, 1e4, true), ARGV[9] == '1'
if worker == '' then return {1, 0, 'worker id must not be empty'} end
if not now then return {1, 0, 'now must be ms >= 0'} end
if not (lease and lease <= 1e12 and fair_every >= 1 and fair_every <= 1e9 and scan >= 1 and scan <= 1e4
    and #settings[4] <= 13 and #settings[5] <= 13 and #settings[6] <= 13 and #settings[7] <= 13
    and #settings[8] <= 13 and #settings[9] <= 13) then
  return {1, 0, 'settings: lease, fair_every, scan, 4 defer bounds, 2 holder waits (whole, < 1e13)'}
end
if not (free and evictable and slots and gpus) then return {1, 0, 'free, evictable, slots, gpus out of range'} end
if levels ~= '0123' and not string.find(levels, '^[0-3]+$') then return {1, 0, 'levels must be digits 0..3'} end
local batches, nb = {}, arg_num(10, 0, 1000, true)
if not nb or #ARGV < 10 + 2 * nb then return {1, 0, 'batch handlers must be name, count pairs'} end
for i = 11, 10 + 2 * nb, 2 do
  batches[ARGV[i]] = arg_num(i + 1, 0, 1e4, true)
  if ARGV[i] == '' or not batches[ARGV[i]] then return {1, 0, 'batch handlers must be name, count pairs'} end
end
local held, held_names, in_use, skip, lane = {}, {}, {}, {}, levels
for i = 11 + 2 * nb, #ARGV, 2 do
  local gb = arg_num(i + 1, -1e9, 1e9)
  local wait = not gb and string.match(ARGV[i + 1], '^~(.+)$')  -- still loading: its task starts cold
  if wait then ARGV[i + 1] = wait; gb = arg_num(i + 1, -1e9, 1e9) end
  local left = not gb and string.match(ARGV[i + 1], '^skip:(%d+)$')
  if ARGV[i] == '' or not (gb or left or ARGV[i + 1] == 'skip') then return {1, 0, 'malformed model pair'} end
  if left then lane = lane .. ' ' .. ARGV[i] .. ' ' .. ms(now + tonumber(left)) end
  if not gb then skip[ARGV[i]] = true else  -- |gb| (0 + -0 is 0); in use if negative, "-0" too
    held[ARGV[i]] = gb < 0 and -gb or 0 + gb
    in_use[ARGV[i]] = wait and 'loading' or gb < 0 or gb == 0 and string.byte(ARGV[i + 1]) == 45
    held_names[#held_names + 1] = ARGV[i]
  end
end
local claimable = free + evictable
local fair = redis.call('HMGET', K_FAIRNESS, '1', '2', '3', 'due_at', 'pickup_at', 'tenancy',
  'reserved_until')  -- the fairness counters (fair[1..3]), then the gates (lib/gates.lua)
local tenancy, pickup = fair[6] == '1', finite(fair[5])  -- tenancy: fair order, quotas
local TTL = '604800000'  -- no result TTL here: a task failed as corrupt stays readable 7 days

-- Room for a task of model m this worker holds (footprint fp GB): free VRAM plus the other idle
-- models, which the worker evicts for it as for a cold load (its ModelCache does the same).
-- evictable counts m too while it is idle, not while a running task uses it.
local function held_room(m, fp)  -- max(0, ...) by a test, not math.max's C call
  local idle_gb = evictable - (in_use[m] and 0 or fp)
  return idle_gb > 0 and free + idle_gb or free
end

if (finite(fair[4]) or math.huge) <= now then promote_due(now, 20, TTL) end
local unread_until = pickup and pickup <= now and reclaim_handed(now, 8, TTL, pickup)

-- Workers woken for a skipped task: the better-placed one (pass_to, a set), or one the first
-- task too big for this worker fits (unfit: {need, priority, gpus, model}).
local pass_to, unfit, retry = false, false

-- The idle worker better placed than this one for a cold task, if any: one holding its
-- model, or one it fits more tightly that runs nothing (a worker with free slots left in
-- `idle` would be handed a whole burst while it takes one task per free slot).
-- What a claim learns of other workers for a (model, need, level, GPUs) is kept for the call:
-- the tasks of one queue ask the same, and the claim writes holders, idle set and running
-- tasks only after its scan (without it: scan x holders reads a queue).
local memo = {}
local function remembered(kind, m, need, p, wants, read)
  local key = kind .. '\n' .. m .. '\n' .. p .. '\n' .. wants
  local by_need = memo[key] or {}
  memo[key] = by_need
  local got = by_need[need] or {read()}
  by_need[need] = got
  return got[1], got[2]
end

local function better_elsewhere(m, need, p, wants)
  return remembered('e', m, need, p, wants, function()
    return idle_holder(m, need, worker, p, wants, now)
      or tightest(need, '(' .. claimable, worker, p, true, wants, m, now) or false
  end)
end

-- Whether the k-th task of queue (p, m) is better left for m's busy holders (busy_holders_of;
-- an idle holder that did not take the task has no room): the first frees up (by its tasks'
-- estimates; an overrun one counts as ending now, none known as now), then they take the
-- queue's tasks in turn (each about est_s long, as this one) and would reach it within the
-- left_s seconds it may still wait: batch work prefers that to a cold load, not past it. Their
-- tasks are read (next_task) only until one frees up soon enough (the test is monotonic in
-- that time: the soonest of all is no later); what was read is kept for the call.
local function wait_for_holders(m, need, p, k, est_s, left_s, wants)
  local h = remembered('b', m, need, p, wants, function()
    return {holders = busy_holders_of(m, need, p, worker, wants), h = 0, t = 0, ids = {}, soonest = math.huge}
  end)
  local n = #h.holders
  if n == 0 then return false end
  local function within(free_in) return free_in + math.floor((k - 1) / n) * est_s <= left_s end
  while not (h.soonest < math.huge and within(h.soonest)) do
    local t = next_task(h.holders, h)
    if not t then return within(h.soonest == math.huge and 0 or h.soonest) end
    local r = redis.call('HMGET', task_key(t), 'started_at', 'est_s')
    local started, est = finite(r[1]), finite(r[2])
    local ends = started and est and math.max(0, started + est * 1000 - now) / 1000
    if ends then h.soonest = math.min(h.soonest, ends) end
  end
  return true
end

-- The first `scan` tasks of a queue in the order a claim considers them. For a model this worker
-- holds (a warm start), those that can still start by their score (the start-by time: SLA or
-- deadline) first, oldest first, then the late ones: under overload a late task has missed its
-- SLA already, while taking it first makes the fresh ones behind it miss too. A late task still
-- goes before the next level's work. A cold start misses a short SLA anyway, so other workers
-- take their queues oldest first. With tenancy on, a queue's order is its tenants' fair order (a
-- flooding tenant's tasks lie ahead of now), kept as it is. Also returns the ids and scores read
-- (the head the index keeps) and, when only the first two were, true: the scan reads the rest if
-- it gets there (most claims take the first; the server formats every score it replies).
local function candidates(q, warm)
  local head = redis.call('ZRANGE', q, '0', '1', 'WITHSCORES')
  if tenancy or not warm or not head[2] or head[2] + 0 >= now then  -- a score's text: a number
    return {head[1], head[3]}, head, head[3] ~= nil and scan > 2
  end
  head = redis.call('ZRANGE', q, '0', ms(scan - 1), 'WITHSCORES')
  local ids = redis.call('ZRANGEBYSCORE', q, ms(now), '+inf', 'LIMIT', '0', ms(scan))
  local seen = {}
  for _, id in ipairs(ids) do seen[id] = true end
  for i = 1, #head, 2 do if #ids < scan and not seen[head[i]] then ids[#ids + 1] = head[i] end end
  return ids, head, false
end

-- First task of queue (p, m) this worker can run: its id, the VRAM it will use and its
-- fields (readable), and the queue's head as read (candidates). An id whose hash is gone, or
-- no longer queued, leaves the queue; one whose scheduling fields are corrupt is failed
-- (defect); one whose tenant is at a quota is passed over.
local function scan_queue(p, m)
  local footprint, q = held[m], queue_key(LEVEL_TEXT[p], m)
  local ids, head, more = candidates(q, footprint ~= nil)
  for k = 1, scan do
    if not ids[k] and more then  -- the rest of the first `scan`, from 0: the scan may have removed some
      more = false
      for _, x in ipairs(redis.call('ZRANGE', q, '0', ms(scan - 1))) do
        if x ~= ids[1] and x ~= ids[2] then ids[#ids + 1] = x end
      end
    end
    local id = ids[k]
    if not id then break end
    local all, v, t, o, e, state, tenant, g  -- vram_gb, queued_at, offered, est_s, state, tenant, gpus
    if footprint then
      -- with all a claim reply needs (read whole: lib/batch.lua): the first that fits is taken
      all = read_held(id)
      local x = N_READABLE
      v, t, o, e, state, tenant, g = all[4], all[12], all[x + 1], all[6], all[x + 2], all[9], all[x + 3]
    else
      v, t, o, e, state, tenant, g = unpack(redis.call('HMGET', task_key(id), 'vram_gb', 'queued_at',
        'offered', 'est_s', 'state', 'tenant', 'gpus'))
    end
    local need, queued_at, est, wants = finite(v), finite(t), finite(e), g and tonumber(g) or 1
    local bad = not (need and need > 0) and 'vram_gb' or not queued_at and 'queued_at'
      or not (est and est >= 0) and 'est_s'
    if state ~= 'queued' then
      unqueue(id, p, m)  -- a stale entry: nothing to run
    elseif bad then
      fail_corrupt(id, bad, tostring(p), m, now, TTL)
    elseif tenancy and tenant and over_quota(tenant, need, wants) then
      -- at its tenant's cap: the next task of the queue may be another tenant's
    elseif wants > gpus then
      if not unfit then unfit = {need, p, wants, m} end
    elseif footprint and need - footprint <= held_room(m, footprint) then
      local fields = readable(id, p, m, now, TTL, all, need, est, queued_at)
      if fields then return id, need > footprint and need - footprint or 0, fields, head end
    elseif not footprint and need <= claimable then
      local waited = now - queued_at
      local left = tonumber(settings[4 + p]) - waited
      local offered = o and o ~= '' and o ~= worker  -- a missing field reads false
      local better = left > 0 and (offered or better_elsewhere(m, need, p, wants))
      if better then
        if better ~= true then pass_to = pass_to or {}; pass_to[better] = true end
        retry = math.min(retry or left, left)
        return nil
      end
      -- batch work waits longer for a busy GPU holding its model than pay a cold load here,
      -- while the holders would get to it within its holder wait; later tasks of a deep
      -- backlog are taken here
      left = (p < 2 and 0 or tonumber(settings[6 + p])) - waited
      if not (left > 0 and wait_for_holders(m, need, p, k, est, left / 1000, wants)) then
        local fields = readable(id, p, m, now, TTL)
        if fields then return id, need, fields, head end
      else
        retry = math.min(retry or left, left)
      end
    elseif not unfit then unfit = {need, p, wants, m}
    end
  end
  return nil
end

local has_work = work_ends()  -- levels with work, as far as the index's ends tell

-- Held models first, then the others in head-score order, a page of the index at a time, at
-- most PAGES pages (64 models, the oldest heads): a claim's work is bounded however many
-- models have work; later ones wait for those ahead or a holder (docs/DECISIONS.md, Bounded
-- work). A level known to have work: its page is read only if held models give none.
local function find(p)
  if has_work[p] == false then return nil end
  local page, start = not has_work[p] and work_page(p, 0, 16), 0  -- pages of 16, at most 4
  if page and not page[1] then return nil end
  for i = 1, #held_names do  -- its queue read at once: an empty one costs the same
    local id, use, f, head = scan_queue(p, held_names[i])
    if id then return id, held_names[i], use, f, head end
  end
  page = page or work_page(p, 0, 16)
  while page[1] do
    for _, m in ipairs(page) do
      if not (held[m] or skip[m]) then
        local id, use, f, head = scan_queue(p, m)
        if id then return id, m, use, f, head end
      end
    end
    start = start + 16
    page = #page == 16 and start < 64 and work_page(p, start, 16) or {}
  end
  has_work[p] = nil  -- the scan may have dropped stale entries: read again if asked
  return nil
end

local order, serves = {}, LANE_LEVELS[levels]  -- levels in order: a lookup (lib/lanes.lua)
for p = 1, 3 do if (finite(fair[p]) or 0) >= fair_every then order[#order + 1] = p end end
for p = 0, 3 do order[#order + 1] = p end
if not serves then
  serves = {}; for p = 0, 3 do serves[p] = string.find(levels, LEVEL_TEXT[p], 1, true) end
end

local id, p, m, use, f, head
local reserved, has_key = reserved_task(worker, now, finite(fair[7]) or 0)
if reserved then
  local r = redis.call('HMGET', task_key(reserved), 'state', 'priority', 'model', 'vram_gb', 'tenant', 'gpus')
  local need, footprint = finite(r[4]), r[3] and held[r[3]]
  -- a corrupt one is left to its queue's scan (it fails it); one of a tenant at a limit waits for
  -- the tenant's task here to end (the planner's only room for it), else goes: a claim as usual
  local capped = need and tenancy and r[5] and over_quota(r[5], need, tonumber(r[6]) or 1) and 'drop'
  r.ids = capped and redis.call('SMEMBERS', worker_tasks_key(worker)) or {}  -- no locals to spare
  while #r.ids > 0 do
    if redis.call('HGET', task_key(table.remove(r.ids)), 'tenant') == r[5] then capped = 'waits' end
  end
  if r[1] == 'queued' and level(r[2]) and r[3] and need and need > 0 and (tonumber(r[6]) or 1) <= gpus
      and capped ~= 'drop' then
    if not capped and footprint and need - footprint <= held_room(r[3], footprint) then
      use = math.max(0, need - footprint)
    elseif not capped and not footprint and need <= claimable then
      use = need
    else  -- the tasks it waits for still hold the room: take nothing else, look again soon
      redis.call('ZREM', K_IDLE, worker)
      return {0, 'none', 200}
    end
    f = readable(reserved, r[2], r[3], now, TTL)
    if f then id, p, m = reserved, tonumber(r[2]), r[3] end
  end
end
if has_key then redis.call('DEL', reservation_key(worker)) end  -- used, moot or expired

for i = 1, #order do
  if id then break end
  if serves[order[i]] then
    id, m, use, f, head = find(order[i])
    if id then
      p = order[i]
      if i <= #order - 4 then redis.call('HINCRBY', K_STATS, 'fair:P' .. p, 1) end  -- a starved one
    end
  end
end

-- The retry (ms) to reply, rounded up to LOOK_EVERY: 0 while another idle worker of this shape
-- is due to look again by then (lib/lookout.lua); one skipping a model looks for itself only.
local function look_again(r)
  local shape = shape_of(claimable, levels, gpus)
  if r > 0 then r = math.ceil((now + r) / LOOK_EVERY) * LOOK_EVERY - now end
  local due, w = lookout_of(shape)
  if r > 0 and w ~= worker and due and due >= now and due <= now + r
      and tonumber(redis.call('ZSCORE', K_IDLE, w)) == claimable then return 0 end
  if r > 0 and next(skip) == nil then redis.call('HSET', K_LOOKOUTS, shape, ms(now + r) .. ' ' .. worker)
  elseif w == worker then redis.call('HDEL', K_LOOKOUTS, shape) end
  return r
end

if pass_to then for w in pairs(pass_to) do wake_worker(w) end end
if not id then
  if unfit then
    local w = tightest(unfit[1], '+inf', worker, unfit[2], false, unfit[3], unfit[4], now)
    if w and not (pass_to and pass_to[w]) then wake_worker(w) end
  end
  redis.call('ZADD', K_IDLE, claimable, worker)
  if lane ~= '0123' then redis.call('HSET', K_LANES, worker, lane) end  -- wake-ups read it (lib/lanes)
  -- a hand-over not yet taken up: look again at its deadline (taken back if still not)
  if pickup and pickup > now then unread_until = reclaim_handed(now, 8, TTL, pickup) end
  if unread_until then retry = math.min(retry or math.huge, math.max(1, unread_until - now + 1)) end
  return {0, 'none', look_again(retry or 0)}
end

-- f: what a worker needs to run the task (readable; the rest stays in the hash). The task
-- taken was its queue's head: the index takes the next one from the scan's read (or drops
-- the model when the read saw the whole queue) instead of reading the queue again.
local next_head = head and head[1] == id
-- a model still loading here: its task starts cold, and its batch waits for the load
local reply = take(id, LEVEL_TEXT[p], m, worker, now, now + lease, f,
  held[m] ~= nil and in_use[m] ~= 'loading', tenancy, next_head)
-- a batch handler's task on a held model brings its batch: the VRAM left beside it, none
-- evicted (a cold start's batch waits for its load: claim_batch.lua)
local more, taken, batch_use, seen = held[m] and in_use[m] ~= 'loading' and batches[f[1]], 0, 0, false
if more then
  local at = #reply + 1
  reply[at], reply[at + 1] = 0, ms(now)
  taken, batch_use, reply[at], seen = take_batch(p, m, f[1], gpus, worker, now, now + lease,
    math.max(0, free - use), held[m], true, more, math.max(scan, 4 * more), tenancy, TTL,
    f.score, reply)
  reply[at] = reply[at] - now
  use = use + batch_use
end
count_dispatch(p, fair, fair_every, 1 + taken, has_work)
if seen then
  refresh_head(p, m)
elseif next_head then
  if head[3] then  -- the index moves to the next one's score, unless it is the same (a burst's)
    if head[4] ~= head[2] then
      redis.call('ZADD', K_MODELS_WITH_WORK, work_score(p, head[4]), work_member(p, m))
    end
  elseif #head < 2 * scan then
    redis.call('ZREM', K_MODELS_WITH_WORK, work_member(p, m))
  else
    refresh_head(p, m)
  end
end
if slots > 1 then redis.call('ZADD', K_IDLE, claimable - use, worker)
elseif ARGV[9] ~= '2' then redis.call('ZREM', K_IDLE, worker) end
if slots > 1 and lane ~= levels then redis.call('HSET', K_LANES, worker, lane) end  -- still idle
if lookout then pass_lookout(worker, claimable, levels, gpus, now) end
return reply
