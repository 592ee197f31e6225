-- lib/fair.lua: a tenant's new task takes its place in its queue by fair share.
--
-- While tenants are registered (lib/tenancy.lua), a new task's queue score is its fair
-- order rather than its start-by time: enqueue.lua for each task it queues, fire.lua for a
-- schedule's run (docs/PROTOCOL.md, Tenants).

--@include args
--@include tenancy

-- Terms of tenants (registered: theirs; else weight 1, no caps): one HMGET of those unread.
local terms_of = {}
local function read_terms(names)
  local ask = {}
  for _, t in ipairs(names) do
    if terms_of[t] == nil then ask[#ask + 1] = t end
  end
  if ask[1] then
    local vs = redis.call('HMGET', K_TENANTS, unpack(ask))
    for i, t in ipairs(ask) do terms_of[t] = tenant_terms(vs[i]) or {weight = 1} end
  end
end

-- The per-call state of fair ordering: queued counts, finish tags, lags, each level's total
-- weight of tenants with work, live slots: the tasks live workers run at once, as live
-- workers x the slots per live worker the reaper publishes (`tenant:clock` `slots`,
-- gpuq/reaper/tenant_room.py; 1 until it does), so a share spaces a backlog by the tasks it
-- runs at once however the pool's slots are packaged into workers.
local fair = nil
local function fair_state(now)
  if fair then return fair end
  fair = {queued = {}, finish = {}, lag = {}, total = {}, added = {}}
  local kv = redis.call('HGETALL', K_TENANT_QUEUED)
  for i = 1, #kv, 2 do
    local n = tonumber(kv[i + 1]) or 0
    if n > 0 then fair.queued[kv[i]] = n end
  end
  local per = math.max(1, finite(redis.call('HGET', K_TENANT_CLOCK, 'slots')) or 1)
  fair.live = math.max(1, redis.call('ZCOUNT', K_WORKERS, now, '+inf') * per)
  return fair
end

-- The queue score of a task of tenant t at level p enqueued at `now` (start-by `score`, SLA
-- sla_ms, est_s, need vram), counted as queued (fair_flush writes counts and tags). Its base
-- is where service is now: start-by less SLA less the level's lag (`tenant_clock` p), so a
-- tenant without a backlog joins at the front; with one it goes after its own last task, the
-- next spaced by est_s over the tasks its share runs at once (weight over the level's tenants
-- with work x live slots, capped: max_gpus over the task's gpus, max_vram_gb over its vram).
local function fair_order(now, p, t, score, sla_ms, est_s, vram, gpus)
  local s = fair_state(now)
  local field = p .. ':' .. t
  local backlog = s.queued[field] or 0
  -- the level's tenants with work, t among them once this task is counted: summed again
  -- only when t joins them (a bulk call of one tenant sums once)
  if backlog == 0 or not s.total[p] then
    local names, prefix = {}, p .. ':'
    names[1] = t
    for f in pairs(s.queued) do
      if string.sub(f, 1, 2) == prefix and f ~= field then names[#names + 1] = string.sub(f, 3) end
    end
    table.sort(names)  -- a sum in a fixed order: replays stay byte-identical
    read_terms(names)
    local total = 0
    for _, name in ipairs(names) do total = total + terms_of[name].weight end
    s.total[p] = total
  end
  local total = s.total[p]
  if s.lag[p] == nil then s.lag[p] = finite(redis.call('HGET', K_TENANT_CLOCK, p)) or 0 end
  local order = score - sla_ms - s.lag[p]
  if backlog > 0 then
    s.finish[field] = s.finish[field] or finite(redis.call('HGET', K_TENANT_CLOCK, field)) or 0
    order = math.max(order, s.finish[field])
  end
  local terms = terms_of[t]
  local at_once = math.min(terms.weight / total * s.live, terms.gpus and terms.gpus / gpus or math.huge,
    terms.vram and terms.vram / vram or math.huge)
  s.finish[field] = order + math.floor(est_s * 1000 / math.max(at_once, 1e-3))
  s.queued[field] = backlog + 1
  s.added[field] = (s.added[field] or 0) + 1
  return order
end

-- The work (est_s) each tenant enqueued in this call, while tenancy is on: the reaper's
-- measure of its demand (gpuq/reaper/tenant_room.py)
local work = {}

-- Write the work, and the counts and finish tags fair_order kept (counted: the tasks were
-- counted as queued already, by lib/push.lua).
local function fair_flush(counted)
  for t, est in pairs(work) do redis.call('HINCRBYFLOAT', K_TENANT_WORK, t, est) end
  if not fair then return end
  local tags = {}
  for field, n in pairs(fair.added) do
    if not counted then redis.call('HINCRBY', K_TENANT_QUEUED, field, n) end
    tags[#tags + 1] = field
    tags[#tags + 1] = ms(fair.finish[field])
  end
  if tags[1] then redis.call('HSET', K_TENANT_CLOCK, unpack(tags)) end
end
