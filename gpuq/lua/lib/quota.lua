-- lib/quota.lua: a limited tenant's running tasks and their VRAM stay within its limits.
--
-- While tenancy is on (lib/tenancy.lua), a tenant is limited by its caps (max_gpus and
-- max_vram_gb, registered) and by its bound: the running tasks the reaper lets it have while
-- other tenants' recent demand needs room ("bound:<t>" in `tenant_use`, written by tenant.lua
-- "bound" for gpuq/reaper/tenant_room.py). A limited tenant has its running use in
-- `tenant_use` ("gpus:<t>", "vram:<t>"); each task counted there carries `charged` =
-- "<tenant> <vram_gb>", which release gives back. A claim passes over a task whose start
-- would take its tenant past a limit (tenant.lua recounts when limits come or go).

--@include args
--@include wake
--@include tenancy

-- Quota state of tenant t for a script: its caps, bound and use, read once per call (false:
-- not limited).
local quota = {}
local function quota_of(t)
  if quota[t] == nil then
    local terms = tenant_terms(redis.call('HGET', K_TENANTS, t)) or {}
    local u = redis.call('HMGET', K_TENANT_USE, 'gpus:' .. t, 'vram:' .. t, 'bound:' .. t)
    terms.bound = finite(u[3])
    terms.used_gpus, terms.used_vram = finite(u[1]) or 0, finite(u[2]) or 0
    quota[t] = (terms.gpus or terms.vram or terms.bound) and terms or false
  end
  return quota[t]
end

-- Whether starting a task of tenant t that needs vram GB would take it past a limit.
local function over_quota(t, vram)
  local q = quota_of(t)
  if not q then return false end
  return q.used_gpus + 1 > math.min(q.gpus or math.huge, q.bound or math.huge)
    or q.vram and q.used_vram + vram > q.vram + 1e-9
end

-- Count a started task against its tenant's limits (when it has any).
local function charge(id, t, vram)
  local q = quota_of(t)
  if not q then return end
  q.used_gpus, q.used_vram = q.used_gpus + 1, q.used_vram + vram
  redis.call('HINCRBY', K_TENANT_USE, 'gpus:' .. t, 1)
  redis.call('HINCRBYFLOAT', K_TENANT_USE, 'vram:' .. t, vram)
  redis.call('HSET', task_key(id), 'charged', t .. ' ' .. tostring(vram))
end

-- A charged task stops running (its `charged` field): its use is given back, and a worker
-- woken, since tasks passed over at the cap may now start.
local function discharge(id, charged)
  if not charged or charged == '' then return end
  local t, vram = string.match(charged, '^(%S+) (%S+)$')
  vram = finite(vram)
  redis.call('HDEL', task_key(id), 'charged')
  if not (t and vram) then return end
  if redis.call('HINCRBY', K_TENANT_USE, 'gpus:' .. t, -1) <= 0 then
    redis.call('HDEL', K_TENANT_USE, 'gpus:' .. t, 'vram:' .. t)
  else
    redis.call('HINCRBYFLOAT', K_TENANT_USE, 'vram:' .. t, -vram)
  end
  wake_pool(1)
end
