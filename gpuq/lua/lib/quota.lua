-- lib/quota.lua: a capped tenant's running tasks and their VRAM stay within its caps.
--
-- While tenancy is on (lib/tenancy.lua), a tenant registered with max_gpus or max_vram_gb has
-- its running use in `tenant_use` ("gpus:<t>", "vram:<t>"); each task counted there carries
-- `charged` = "<tenant> <vram_gb>", which release gives back. A claim passes over a task
-- whose start would take its tenant past a cap (tenant.lua recounts when caps change).

--@include args
--@include wake
--@include tenancy

-- Quota state of tenant t for a claim: its caps and use, read once per call (nil: no caps).
local quota = {}
local function quota_of(t)
  if quota[t] == nil then
    local terms = tenant_terms(redis.call('HGET', K_TENANTS, t))
    if terms and (terms.gpus or terms.vram) then
      local u = redis.call('HMGET', K_TENANT_USE, 'gpus:' .. t, 'vram:' .. t)
      terms.used_gpus, terms.used_vram = finite(u[1]) or 0, finite(u[2]) or 0
      quota[t] = terms
    else
      quota[t] = false
    end
  end
  return quota[t]
end

-- Whether starting a task of tenant t that needs vram GB would take it past a cap.
local function over_quota(t, vram)
  local q = quota_of(t)
  if not q then return false end
  return q.gpus and q.used_gpus + 1 > q.gpus or q.vram and q.used_vram + vram > q.vram + 1e-9
end

-- Count a started task against its tenant's caps (when it has any).
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
