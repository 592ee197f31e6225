-- tenant.lua: register, change or remove a tenant, or set the pool's tenant policy.
--
-- A tenant's weight is its share of each level against the other tenants with work queued
-- there; max_gpus and max_vram_gb cap the GPUs its running tasks ask for and their VRAM,
-- and its bound caps its running tasks (lib/quota.lua). A tenant whose limits come or go has its running use
-- recounted from the running set (O(running tasks): an operator's call, or a bound the
-- reaper sets or lifts), so limits bind the tasks already running too: a tenant over a new
-- limit starts nothing until its tasks bring it back under. Removing the last tenant ends
-- tenancy: the finish tags, bounds, counts of use, work totals and per-tenant SLA counts in
-- `stats` go (running tasks are no longer charged), queued tasks keep their places, and the
-- queued counts stay, exact, until the tasks counted there leave their queues (scripts
-- leave them whether tenancy is on or not).
--
-- KEYS[1]  pool key base
-- ARGV[1]  "set": ARGV[2] name, ARGV[3] weight (> 0), ARGV[4] max_gpus (an integer >= 0, or
--          "-": none), ARGV[5] max_vram_gb (>= 0, or "-")
--          "remove": ARGV[2] name
--          "require": ARGV[2] "1" (enqueue refuses tenants not registered) or "0"
--          "bound": then pairs: name, the running tasks it may have (an integer >= 1) or
--          "-" (none): the reaper's (gpuq/reaper/tenant_room.py); a bound lifted or raised
--          wakes as many idle workers (the tenant's passed-over tasks may start); nothing
--          while tenancy is off
--          "forget": ARGV[2] cutoff (ms), then pairs: name, its work total as the reaper read
--          it: the state of an unregistered tenant gone quiet goes (its work total, finish
--          tags and SLA counts in `stats`) unless it is registered, its total moved, it has
--          tasks queued, running use or a bound counted, or a finish tag after the cutoff
--          (gpuq/reaper/tenant_room.py); reply {0, the names forgotten, comma-separated}
--          "slots": ARGV[2] the slots per live worker (1..1e6: their mean concurrency), the
--          reaper's, which lib/fair.lua multiplies the live workers by; nothing while
--          tenancy is off
-- Returns  {0, previous}   done; previous: the tenant's former value or policy ("" if none)
--          {4}             NOT_FOUND: remove of a tenant not registered
--          {1, 0, reason}  INVALID: a malformed argument (nothing written)

--@include args
--@include tenancy
--@include wake
--@include gates
--@include quota

-- Charge (capped) or discharge (not) each running task of tenant t; set its use to the sum.
local function recount(t, capped)
  local gpus, tasks, vram = 0, 0, 0
  for _, id in ipairs(redis.call('ZRANGE', K_RUNNING, 0, -1)) do
    local f = redis.call('HMGET', task_key(id), 'tenant', 'vram_gb', 'state', 'gpus')
    if f[1] == t and f[3] == 'running' then
      if capped then
        local v, g = finite(f[2]) or 0, tonumber(f[4]) or 1
        redis.call('HSET', task_key(id), 'charged', charged_value(t, v, g))
        gpus, tasks, vram = gpus + g, tasks + 1, vram + v
      else
        redis.call('HDEL', task_key(id), 'charged')
      end
    end
  end
  redis.call('HDEL', K_TENANT_USE, 'gpus:' .. t, 'tasks:' .. t, 'vram:' .. t)
  if tasks > 0 then
    redis.call('HSET', K_TENANT_USE, 'gpus:' .. t, gpus, 'tasks:' .. t, tasks, 'vram:' .. t, tostring(vram))
  end
end

-- Whether tenant t is limited (caps, or a bound): its running use is counted.
local function limited(t)
  local terms = tenant_terms(redis.call('HGET', K_TENANTS, t))
  return (terms and (terms.gpus or terms.vram)) ~= nil
    or redis.call('HEXISTS', K_TENANT_USE, 'bound:' .. t) == 1
end

local function bad_name(t)
  return not t or t == '' or #t > 200 or string.find(t, '[%s%c{},]') ~= nil
end

-- Whether tenant t keeps its state: registered, its work total not `total`, tasks queued, use
-- or a bound counted, or a finish tag after `cutoff` (a later task of it may still queue
-- behind it: lib/fair.lua reads a tag while the tenant has tasks queued at that level).
local function keeps(t, total, cutoff)
  if redis.call('HEXISTS', K_TENANTS, t) == 1 or redis.call('HGET', K_TENANT_WORK, t) ~= total then
    return true
  end
  for _, kind in ipairs({'tasks:', 'bound:'}) do
    if redis.call('HEXISTS', K_TENANT_USE, kind .. t) == 1 then return true end
  end
  for p = 0, 3 do
    if redis.call('HEXISTS', K_TENANT_QUEUED, p .. ':' .. t) == 1 then return true end
    if (finite(redis.call('HGET', K_TENANT_CLOCK, p .. ':' .. t)) or 0) > cutoff then return true end
  end
  return false
end

local op, name = ARGV[1], ARGV[2]
if op == 'forget' then
  local cutoff = arg_num(2, 0, 1e15)
  if not cutoff or #ARGV % 2 ~= 0 then return {1, 0, 'forget takes a cutoff, then name, total pairs'} end
  local gone = {}
  for i = 3, #ARGV, 2 do
    local t = ARGV[i]
    if not bad_name(t) and not keeps(t, ARGV[i + 1], cutoff) then
      redis.call('HDEL', K_TENANT_WORK, t)
      for p = 0, 3 do
        redis.call('HDEL', K_TENANT_CLOCK, p .. ':' .. t)
        redis.call('HDEL', K_STATS, 'sla_met:P' .. p .. ':' .. t, 'sla_missed:P' .. p .. ':' .. t)
      end
      gone[#gone + 1] = t
    end
  end
  return {0, table.concat(gone, ',')}
end
if op == 'bound' then
  if #ARGV % 2 ~= 1 then return {1, 0, 'bound takes name, bound pairs'} end
  for i = 2, #ARGV, 2 do
    if bad_name(ARGV[i]) or not (ARGV[i + 1] == '-' or arg_num(i + 1, 1, 1e6, true)) then
      return {1, 0, 'bound takes tenant names and bounds: integers 1..1e6 or -'}
    end
  end
  if not tenancy_on() then return {0, ''} end  -- removed since the reaper read: no limits
  local woken = 0
  for i = 2, #ARGV, 2 do
    local t, field = ARGV[i], 'bound:' .. ARGV[i]
    local was, old = limited(t), finite(redis.call('HGET', K_TENANT_USE, field))
    if ARGV[i + 1] == '-' then redis.call('HDEL', K_TENANT_USE, field)
    else redis.call('HSET', K_TENANT_USE, field, ARGV[i + 1]) end
    if limited(t) ~= was then recount(t, not was) end
    if old and (ARGV[i + 1] == '-' or tonumber(ARGV[i + 1]) > old) then woken = woken + 1 end
  end
  if woken > 0 then wake_pool(woken) end
  return {0, ''}
end
if op == 'slots' then
  if #ARGV ~= 2 or not arg_num(2, 1, 1e6) then return {1, 0, 'slots takes a number 1..1e6'} end
  if not tenancy_on() then return {0, ''} end  -- removed since the reaper read: no fair order
  local before = redis.call('HGET', K_TENANT_CLOCK, 'slots') or ''
  redis.call('HSET', K_TENANT_CLOCK, 'slots', ARGV[2])
  return {0, before}
end
if op == 'require' then
  if #ARGV ~= 2 or (name ~= '1' and name ~= '0') then return {1, 0, 'require takes 1 or 0'} end
  local before = redis.call('HGET', K_TENANTS, REQUIRED) or ''
  if name == '1' then redis.call('HSET', K_TENANTS, REQUIRED, '1') else redis.call('HDEL', K_TENANTS, REQUIRED) end
  gate_tenancy()
  return {0, before}
end
if bad_name(name) then
  return {1, 0, 'tenant name must be a non-empty name without spaces, commas or braces'}
end
local before = redis.call('HGET', K_TENANTS, name)
if op == 'set' then
  if #ARGV ~= 5 then return {1, 0, 'set takes name, weight, max_gpus, max_vram_gb'} end
  local w = arg_num(3, 1e-6, 1e6)
  local g = ARGV[4] == '-' or arg_num(4, 0, 1e6, true)
  local v = ARGV[5] == '-' or arg_num(5, 0, 1e9)
  if not (w and g and v) then
    return {1, 0, 'weight must be 1e-6..1e6, max_gpus an integer >= 0 or -, max_vram_gb >= 0 or -'}
  end
  local value = table.concat({tostring(w), ARGV[4] == '-' and '-' or tostring(g),
    ARGV[5] == '-' and '-' or tostring(v)}, ' ')
  redis.call('HSET', K_TENANTS, name, value)
  gate_tenancy()
  recount(name, limited(name))
  return {0, before or ''}
end
if op == 'remove' then
  if #ARGV ~= 2 then return {1, 0, 'remove takes a name'} end
  if not before then return {4} end
  redis.call('HDEL', K_TENANTS, name)
  if not gate_tenancy() then  -- tenancy ends: nobody is limited or counted
    for _, id in ipairs(redis.call('ZRANGE', K_RUNNING, 0, -1)) do
      redis.call('HDEL', task_key(id), 'charged')
    end
    redis.call('DEL', K_TENANT_CLOCK, K_TENANT_USE, K_TENANT_WORK)
    -- the reaper forgets quiet tenants only while tenancy is on: their SLA counts go now
    for _, field in ipairs(redis.call('HKEYS', K_STATS)) do
      if string.find(field, '^sla_m%a+:P%d:') then redis.call('HDEL', K_STATS, field) end
    end
  else
    recount(name, limited(name))
  end
  return {0, before}
end
return {1, 0, 'the first argument must be set, remove, require, bound, forget or slots'}
