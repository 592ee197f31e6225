-- fire.lua: enqueue the run of a periodic task (gpuq schedule) for one period, once.
--
-- The schedule's last fired period (`schedules:fired`) is compared, the run enqueued and
-- the period recorded in this one call, so reapers that race, or one restarted, enqueue a
-- period's run once. A run is a normal task, id "<name>@<period>", field `schedule` =
-- "<name> <period>", queued now (held as due now, lib/defer.lua, then pushed: its score
-- now + its SLA, or its deadline, from now, less its estimate if earlier), and a new
-- arrival as an enqueued task is: counted in its model's arrivals (the forecast's
-- history) and, while tenants are registered, placed by its tenant's fair order and
-- counted in its work (lib/fair.lua). In a pool that requires registered tenants, a run
-- of another tenant ends failed at once, with why; so does one past its tenant's caps.
--
-- KEYS[1]  pool key base
-- ARGV[1]  now (ms; "0" = server clock)
-- ARGV[2]  schedule name
-- ARGV[3]  period (epoch ms): the run's scheduled time
-- ARGV[4]  skip: "1" records the period without a run (skip_missed: fired too late)
-- ARGV[5..8]  SLA of P0..P3 (ms)
-- ARGV[9]  result TTL (ms): how long a run whose stored fields are corrupt stays readable
-- Returns  {0, "enqueued", id} | {0, "skipped"} | {0, "done"} (this period, or a later
--          one, was fired already) | {0, "failed", id} (the run ended failed: its tenant is
--          not registered where that is required, or its caps could never let it run, or
--          the stored task is corrupt)
--          {4} NOT_FOUND: no such schedule
--          {1, 0, reason} INVALID: a malformed argument or stored schedule (nothing written)

--@include args
--@include json
--@include names
--@include runtime
--@include tenancy
--@include defer
--@include failures
--@include push
--@include fair
--@include arrivals

if #ARGV ~= 9 then return {1, 0, 'expected 9 arguments'} end
local now, name, period, ttl = clock(ARGV[1]), ARGV[2], arg_num(3, 0, 1e15, true), ttl_arg(9)
local sla = {['0'] = arg_num(5, 0, 1e13, true), ['1'] = arg_num(6, 0, 1e13, true),
  ['2'] = arg_num(7, 0, 1e13, true), ['3'] = arg_num(8, 0, 1e13, true)}
if not (now and period and ttl and sla['0'] and sla['1'] and sla['2'] and sla['3']) then
  return {1, 0, 'now, period, SLAs and ttl must be ms >= 0'}
end
local text = redis.call('HGET', K_SCHEDULES, name)
if not text then return {4} end
local ok, s = pcall(cjson.decode, text)
local t = ok and type(s) == 'table' and type(s.task) == 'table' and s.task
if not t or type(s.anchor_ms) ~= 'number' then return {1, 0, 'schedule ' .. name .. ' is not readable'} end
-- checked as enqueue checks a producer's task: the hash is a key other roles may write
local id, prio, tenant = name .. '@' .. ms(period), level(t.priority), t.tenant == nil and 'default' or t.tenant
local vram, gpus, tries = tonumber(t.vram_gb), tonumber(t.gpus or 1), tonumber(t.max_attempts or 3)
local function bad(s) return type(s) ~= 'string' or bad_name(s) end
local function beyond(x, low, high)  -- given, and not a number in [low, high]
  return x ~= nil and not (tonumber(x) and tonumber(x) >= low and tonumber(x) <= high)
end
if not prio or bad(t.handler) or bad(t.model) or bad(tenant) or bad(id)
    or type(t.payload) ~= 'string' or #t.payload > 1048576 or not is_json(t.payload)
    or not (vram and vram > 0 and vram <= 1e6) or not (gpus and gpus >= 1 and gpus <= 64 and gpus % 1 == 0)
    or not (tries and tries >= 1 and tries <= 100 and tries % 1 == 0)
    or beyond(t.est_s, 0, 1e10) or beyond(t.deadline_ms, 1, 1e13) then
  return {1, 0, 'schedule ' .. name .. ' has a malformed task'}
end
local last = finite(redis.call('HGET', K_SCHEDULE_FIRED, name)) or s.anchor_ms
if period <= last then return {0, 'done'} end
redis.call('HSET', K_SCHEDULE_FIRED, name, ms(period))
if ARGV[4] == '1' then return {0, 'skipped'} end

if redis.call('EXISTS', task_key(id)) == 1 then return {0, 'done'} end
local est, history = tonumber(t.est_s), nil
if not est then
  est = read_runtime(redis.call('HGET', K_RUNTIMES, runtime_field(t.handler, t.model)))
  history = est and 'history' or ''
  est = est or 1
end
local tenancy = tenancy_on()
hold(id, {'id', id, 'handler', t.handler, 'payload', t.payload, 'model', t.model,
  'vram_gb', tostring(t.vram_gb), 'priority', prio, 'est_s', tostring(est),
  'preemptible', t.preemptible == false and '0' or '1', 'tenant', tenant,
  'max_attempts', ms(tries), 'enqueued_at', ms(now), 'queued_at', ms(now),
  'est_from', history or '', 'schedule', name .. ' ' .. ms(period), 'gpus', ms(gpus)},
  {due = now}, now, sla[prio], tonumber(t.deadline_ms), est, false)  -- its order: below
redis.call('ZREM', K_DELAYED, id)
redis.call('HINCRBY', K_STATS, 'enqueued', 1)
count_arrivals(now, {t.model, [t.model] = 1})
if tenancy then
  local required, terms = unpack(redis.call('HMGET', K_TENANTS, REQUIRED, tenant))
  local why = required == '1' and not terms
    and 'tenant ' .. tenant .. ' is not registered (this pool requires it: gpuq tenant set)'
    or past_caps(tenant, tenant_terms(terms), gpus, vram, tostring(t.vram_gb))
  if why then
    end_failed(id, now, ttl, why)
    return {0, 'failed', id}
  end
end
if tenancy then
  local score = tonumber(redis.call('HGET', task_key(id), 'score'))
  redis.call('HSET', task_key(id), 'order', ms(fair_order(now, prio, tenant, score, sla[prio], est,
    vram, gpus)))
  work[tenant] = est
end
redis.call('HSET', task_key(id), 'state', 'queued')
if push(id, now, ttl) ~= 'queued' then return {0, 'failed', id} end
if tenancy then fair_flush(true) end  -- push counted it as queued
return {0, 'enqueued', id}
