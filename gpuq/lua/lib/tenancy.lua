-- lib/tenancy.lua: tenants share each level by weight (their quotas: lib/quota.lua).
--
-- Tenancy is on while the `tenants` hash exists (`gpuq tenant set`); until then a task's
-- tenant is a label and none of this runs. While on:
-- - Fair order (enqueue.lua's fair_order). A task's place in its queue (`order`, the
--   queue's score) is where service at its level is now (its arrival, moved back by how far
--   the level's service lags: claims keep that in `tenant_clock`), unless its tenant already
--   has tasks queued at its level: then it goes after the tenant's last one, spaced by the
--   time the tenant's share of the pool takes to run it (est_s over share x live slots,
--   share = its weight over the weights of the level's tenants with queued work, at most its
--   caps). A tenant asking no more than its share goes to the front; one flooding a level
--   drifts behind the others' new tasks instead of ahead of them. Only queued tasks count
--   (`tenant_queued`), so a tenant idle for a while starts afresh.
-- - Quotas (lib/quota.lua).
-- - SLA results per tenant (count_tenant_sla).
-- Tasks counted in `tenant_queued` carry `fair` = their "<p>:<tenant>" field, so whichever
-- script takes them out of their queue takes them out of the count.

--@include args

local REQUIRED = ' required'  -- the pool's policy field: no tenant name holds a space

local function tenancy_on() return redis.call('EXISTS', K_TENANTS) == 1 end

-- A tenants value "<weight> <max_gpus> <max_vram_gb>" ('-': no cap) as a table, or nil.
local function tenant_terms(v)
  if not v then return nil end
  local w, g, x = string.match(v, '^(%S+) (%S+) (%S+)$')
  w = finite(w)
  if not w or w <= 0 then return nil end
  return {weight = w, gpus = g ~= '-' and finite(g) or nil, vram = x ~= '-' and finite(x) or nil}
end

-- Why tenant t could never run a task of gpus GPUs and vram GB (vram_text, as given) under
-- the caps it has now (terms: its tenant_terms, or false), or nil: enqueue refuses such a
-- task and a periodic run of it ends failed, rather than wait unclaimed while the caps stand.
local function past_caps(t, terms, gpus, vram, vram_text)
  if not terms or not (terms.gpus and gpus > terms.gpus or terms.vram and vram > terms.vram + 1e-9) then
    return nil
  end
  return 'tenant ' .. t .. ' could never run it: it needs ' .. gpus .. ' GPUs and ' .. vram_text
    .. ' GB, the tenant\'s caps allow ' .. (terms.gpus or 'any') .. ' GPUs and '
    .. (terms.vram or 'any') .. ' GB (gpuq tenant set)'
end

-- A tenant's SLA results ("met"/"missed"; others are not decided yet) in `stats`,
-- "sla_met:P<p>:<tenant>" and "sla_missed:...", where the SLA is decided, while tenancy is on.
local function count_tenant_sla(p, t, result)
  if (result == 'met' or result == 'missed') and t and t ~= '' then
    redis.call('HINCRBY', K_STATS, 'sla_' .. result .. ':P' .. p .. ':' .. t, 1)
  end
end

-- Task id leaves its queue: out of its tenant's count (fair_field: its `fair` field, which
-- is cleared, so a task leaves the count once whichever script sees it go).
local function fair_leave(id, fair_field)
  if not fair_field or fair_field == '' then return end
  if redis.call('HINCRBY', K_TENANT_QUEUED, fair_field, -1) <= 0 then
    redis.call('HDEL', K_TENANT_QUEUED, fair_field)
  end
  redis.call('HSET', task_key(id), 'fair', '')
end
