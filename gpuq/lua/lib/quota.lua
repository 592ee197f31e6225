-- lib/quota.lua: a limited tenant's running tasks, their GPUs and VRAM stay within its limits.
--
-- While tenancy is on (lib/tenancy.lua), a tenant is limited by its caps (max_gpus: the GPUs
-- its running tasks ask for, a task of gpus=N counting N, tasks sharing one GPU one each:
-- a batch's tasks are capped as tasks; max_vram_gb, registered) and by
-- its bound: the running tasks the reaper lets it have while other tenants' recent demand
-- needs room ("bound:<t>" in `tenant_use`, written by tenant.lua "bound" for
-- gpuq/reaper/tenant_room.py; a bound counts tasks, as the reaper's share counts workers). A
-- limited tenant has its running use in `tenant_use` ("gpus:<t>", "tasks:<t>", "vram:<t>");
-- each task counted there carries `charged` = "<tenant> <vram_gb>[ <gpus>]", which release
-- gives back. A claim passes over a task whose start would take its tenant past a limit
-- (tenant.lua recounts when limits come or go).

--@include args
--@include wake
--@include tenancy

-- Quota state of tenant t for a script: its caps, bound and use, read once per call (false:
-- not limited).
local quota = {}
local function quota_of(t)
  if quota[t] == nil then
    local terms = tenant_terms(redis.call('HGET', K_TENANTS, t)) or {}
    local u = redis.call('HMGET', K_TENANT_USE, 'gpus:' .. t, 'vram:' .. t, 'bound:' .. t, 'tasks:' .. t)
    terms.bound = finite(u[3])
    terms.used_gpus, terms.used_vram = finite(u[1]) or 0, finite(u[2]) or 0
    -- no task count yet (use counted before GPUs were): each task held one GPU then
    terms.used_tasks = finite(u[4]) or terms.used_gpus
    quota[t] = (terms.gpus or terms.vram or terms.bound) and terms or false
  end
  return quota[t]
end

-- Whether starting a task of tenant t that needs vram GB across gpus GPUs would take it
-- past a limit.
local function over_quota(t, vram, gpus)
  local q = quota_of(t)
  if not q then return false end
  return q.gpus and q.used_gpus + gpus > q.gpus or q.bound and q.used_tasks + 1 > q.bound
    or q.vram and q.used_vram + vram > q.vram + 1e-9
end

-- The `charged` value of a task of tenant t that needs vram GB across gpus GPUs.
local function charged_value(t, vram, gpus)
  return t .. ' ' .. tostring(vram) .. (gpus > 1 and ' ' .. gpus or '')
end

-- Count a started task against its tenant's limits (when it has any).
local function charge(id, t, vram)
  local q = quota_of(t)
  if not q then return end
  local gpus = tonumber(redis.call('HGET', task_key(id), 'gpus')) or 1  -- read by limited tenants only
  q.used_gpus, q.used_tasks, q.used_vram = q.used_gpus + gpus, q.used_tasks + 1, q.used_vram + vram
  redis.call('HINCRBY', K_TENANT_USE, 'gpus:' .. t, gpus)
  redis.call('HINCRBY', K_TENANT_USE, 'tasks:' .. t, 1)
  redis.call('HINCRBYFLOAT', K_TENANT_USE, 'vram:' .. t, vram)
  redis.call('HSET', task_key(id), 'charged', charged_value(t, vram, gpus))
end

-- A charged task stops running (its `charged` field): its use is given back, and a worker
-- woken, since tasks passed over at the cap may now start.
local function discharge(id, charged)
  if not charged or charged == '' then return end
  local t, vram, gpus = string.match(charged, '^(%S+) (%S+) ?(%d*)$')
  vram, gpus = finite(vram), tonumber(gpus) or 1
  redis.call('HDEL', task_key(id), 'charged')
  if not (t and vram) then return end
  if redis.call('HINCRBY', K_TENANT_USE, 'gpus:' .. t, -gpus) <= 0 then
    redis.call('HDEL', K_TENANT_USE, 'gpus:' .. t, 'tasks:' .. t, 'vram:' .. t)
  else
    redis.call('HINCRBY', K_TENANT_USE, 'tasks:' .. t, -1)
    redis.call('HINCRBYFLOAT', K_TENANT_USE, 'vram:' .. t, -vram)
  end
  wake_pool(1)
end
