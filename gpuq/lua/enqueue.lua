-- enqueue.lua: validate and enqueue one or many tasks atomically, then wake workers.
--
-- All tasks of a call are validated before any is written: one bad task rejects the call.
-- A P0/P1 task no idle worker was woken for wakes the reaper (`urgent`) to plan preemption.
-- A task's queue score is its start-by time: now plus its SLA, or deadline minus estimate if
-- earlier. A call of one task whose picked worker idles with one slot hands it over: started
-- here for that worker, its fields pushed onto the worker's wake list, taken back if unread
-- past a pickup deadline (docs/PROTOCOL.md, Hand-over). Arrivals are counted per model in
-- the minute's `arrivals:<bucket>` hash (the forecast's history).
--
-- KEYS[1]  pool key base, e.g. "gpuq:{default}:"
-- ARGV[1]  now (ms; "0" = server clock)
-- ARGV[2]  check_fit: "1" rejects a task no registered GPU class could fit (VRAM, or
--          GPUs: a class of groups of N devices holds tasks of up to N), or whose handler
--          no worker of the pool has registered. A task past its tenant's caps (more
--          GPUs or VRAM than they allow) is refused either way (INVALID)
-- ARGV[3]  SLAs of P0..P3 (ms), in one text: 4 whole numbers (< 1e13), space-separated
-- ARGV[4..]  groups of 16 per task: id, handler, payload (JSON text), model, vram_gb,
--            priority (0..3), est_s ("": the mean run time learned for its handler and
--            model, and est_from "history", else 1), deadline_ms (relative to now, "" =
--            none; stored absolute), preemptible ("1"/"0"), tenant, max_attempts,
--            report_end ("1": list the task in `ended` if it ends other than succeeded,
--            for its producer; "0"), gpus (1..64: devices it runs across; its
--            vram_gb is its need over all of them), due ("": now; "+<ms>": a delay;
--            "<ms>": an epoch time, not past), after (parent ids, comma-separated),
--            after_any ("1": queued once every parent ended; "0": once every one
--            succeeded): see `deferral`
-- Returns  {0, n}                              all n tasks enqueued
--          {1, index, reason}                  INVALID: task at 1-based index is malformed
--                                              (index 0: the call's own arguments), at in
--                                              the past, a parent unknown or ended badly
--          {2, index, id}                      DUPLICATE: a task with this id exists
--          {3, index, vram_gb, largest_gb, gpus, most_gpus}  UNSCHEDULABLE (only with
--                                              check_fit): largest_gb is the largest class
--                                              with at least its gpus (0: none has)
--          {7, index, handler}                 UNREGISTERED: no worker registers the handler
--                                              (only with check_fit)

--@include args
--@include json
--@include names
--@include queue
--@include wake
--@include holders
--@include start
--@include runtime
--@include tenancy
--@include fair
--@include quota
--@include defer
--@include gates
--@include arrivals
--@include classes

local now = clock(ARGV[1])
local check_fit = ARGV[2] == '1'
-- the SLAs' texts, checked here; a level's is read (sla, by the priority's text as it comes) when
-- the first task of it is validated: a call of one task reads one, not four (C calls)
local slas, sla = {string.match(ARGV[3] or '', '^(%d+) (%d+) (%d+) (%d+)$')}, {}
local G = 16
local n = (#ARGV - 3) / G
if n < 1 or n % 1 ~= 0 then return {1, 0, 'expected groups of 16 task fields'} end
if not now then return {1, 0, 'now must be ms >= 0'} end
if not (slas[1] and #slas[1] <= 13 and #slas[2] <= 13 and #slas[3] <= 13 and #slas[4] <= 13) then
  return {1, 0, 'SLAs must be 4 whole ms < 1e13'}
end

-- An idle worker's hand-over settings (defer bound, fair_every, lease ms) if it takes hand-overs
-- (one slot); nil for a worker with more slots (woken instead) or a burst worker.
local function handover(w)
  local h = redis.call('HMGET', worker_key(w), 'concurrency', 'handover_defer_ms', 'fair_every', 'lease_ms')
  local defer, fair_every, lease = finite(h[2]), finite(h[3]), finite(h[4])
  if h[1] ~= '1' or not (defer and fair_every and lease) then return nil end
  return {defer = defer, fair_every = fair_every, lease = lease}
end

local good = {}  -- handler, model and tenant checked together: bulk calls repeat them

-- check_fit: the classes' usable VRAM and GPUs (one-GPU classes are not in class_gpus)
local classes, most_gpus, registered = {}, 0, {}  -- registered: handler -> ever registered
if check_fit then
  local kv, g, count = redis.call('HGETALL', K_CLASSES), redis.call('HGETALL', K_CLASS_GPUS), {}
  for i = 1, #g, 2 do count[g[i]] = tonumber(g[i + 1]) end
  for i = 1, #kv, 2 do
    classes[#classes + 1] = {gb = finite(kv[i + 1]) or 0, gpus = count[kv[i]] or 1}
    most_gpus = math.max(most_gpus, count[kv[i]] or 1)
  end
end

-- The deferral of task id (its fields due, after, after_any; lib/defer.lua holds it): false
-- (queued now), {due = ms} (delayed), {parents, pending, any, ready} (waiting; ready: none
-- pending), or nil and the reason. Parents are stored or earlier in this call and the id is
-- new, so no stored task waits on it: no cycle can form (docs/DECISIONS.md, Dependencies).
local ENDED = {succeeded = true, failed = true, expired = true, canceled = true}
local function deferral(id, due, after, any, seen)
  if any ~= '0' and any ~= '1' then return nil, 'after_any must be 0 or 1' end
  if due ~= '' then
    local rel, t = string.byte(due) == 43, string.find(due, '^%+?%d+$') and tonumber(string.match(due, '%d+'))
    if not t or t > 1e13 or after ~= '' then return nil, 'due must be +<ms> or epoch ms, without after' end
    if not rel and t < now then
      return nil, string.format('at is in the past: %.3f < server time %.3f (epoch s)', t / 1000, now / 1000)
    end
    t = rel and now + t or t
    return t > now and {due = t}
  end
  if after == '' then return false end
  local d, listed = {parents = {}, pending = {}, any = any == '1'}, {}
  for p in string.gmatch(after, '[^,]+') do
    local state = p ~= id and (seen[p] and 'queued' or redis.call('HGET', task_key(p), 'state'))
    if not state then return nil, p == id and 'a task cannot wait for itself' or 'unknown parent task ' .. p end
    if not listed[p] then
      listed[p], d.parents[#d.parents + 1] = true, p
      if not ENDED[state] then d.pending[#d.pending + 1] = p
      elseif state ~= 'succeeded' and not d.any then return nil, 'parent task ' .. p .. ' ended ' .. state end
    end
  end
  if #d.parents > 100 then return nil, 'after names more than 100 tasks' end
  d.ready = d.pending[1] == nil
  return d
end

-- Tenants (lib/tenancy.lua): while any is registered, a task's score is its tenant's fair order, a
-- limited tenant's task is not handed over (claims keep quotas), unregistered ones may be refused.
-- One EXISTS counts three keys a busy pool's enqueue usually finds absent: the tenants hash,
-- the first task's hash (its id taken) and the idle set; only a count > 0 asks each alone
local present = redis.call('EXISTS', K_TENANTS, task_key(ARGV[4]), K_IDLE)
local idle_n = present > 0 and redis.call('ZCARD', K_IDLE) or 0  -- only the wakes below change it
local listed = idle_n > 0 and 1 or 0  -- `idle` among the keys counted
local tenancy = present > listed and tenancy_on()
local first_taken = present > listed + (tenancy and 1 or 0)
local required = tenancy and redis.call('HGET', K_TENANTS, REQUIRED) == '1'
local known_tenant = {}

-- validate every task first
local seen = {}
local vrams, ests, tries, gpus_of = {}, {}, {}, {}  -- each task's numbers, parsed once
local learned, from_history = {}, {}  -- "<handler> <model>" -> mean or false; task -> true
local ready, held = {}, {}  -- tasks queued now (indexes); deferred ones (lib/defer.lua)
for i = 1, n do
  local o = 3 + (i - 1) * G
  local id, handler, payload, model = ARGV[o + 1], ARGV[o + 2], ARGV[o + 3], ARGV[o + 4]
  local vram, prio = SMALL[ARGV[o + 5]] or tonumber(ARGV[o + 5]), ARGV[o + 6]
  local est = ARGV[o + 7] ~= '' and tonumber(ARGV[o + 7]) or nil  -- "": no C call
  local deadline, pre, tenant, attempts = ARGV[o + 8], ARGV[o + 9], ARGV[o + 10], ARGV[o + 11]
  attempts = SMALL[attempts] or tonumber(attempts)
  local gpus = SMALL[ARGV[o + 13]] or tonumber(ARGV[o + 13])
  -- one scan over the four names (the id alone once the others passed), one by one only to say
  -- which is bad; the cache key joins them with a comma, which no good name holds
  local names = handler .. ',' .. model .. ',' .. tenant
  local known = good[names]
  if id == '' or #id > 200
      or bad_chars(known and id or id .. '|' .. handler .. '|' .. model .. '|' .. tenant)
      or not known and (handler == '' or model == '' or tenant == ''
        or #handler > 200 or #model > 200 or #tenant > 200) then
    if bad_name(id) then return {1, i, 'id must be a non-empty name without spaces, commas or braces'} end
    if bad_name(handler) then return {1, i, 'handler must be a non-empty name'} end
    if bad_name(model) then return {1, i, 'model must be a non-empty name'} end
    if bad_name(tenant) then return {1, i, 'tenant must be a non-empty name'} end
  end
  good[names] = true
  if required then
    if known_tenant[tenant] == nil then
      known_tenant[tenant] = redis.call('HEXISTS', K_TENANTS, tenant) == 1
    end
    if not known_tenant[tenant] then
      return {1, i, 'tenant ' .. tenant .. ' is not registered (this pool requires it: gpuq tenant set)'}
    end
  end
  if not vram or vram ~= vram or vram <= 0 or vram == math.huge then
    return {1, i, 'vram_gb must be a number > 0'}
  end
  if prio ~= '0' and prio ~= '1' and prio ~= '2' and prio ~= '3' then return {1, i, 'priority must be 0..3'} end
  sla[prio] = sla[prio] or SMALL[slas[SMALL[prio] + 1]] or tonumber(slas[SMALL[prio] + 1])
  if not est and ARGV[o + 7] == '' then  -- none given: learned from history, else 1 s
    local pair = runtime_field(handler, model)
    if learned[pair] == nil then
      learned[pair] = read_runtime(redis.call('HGET', K_RUNTIMES, pair)) or false
    end
    est, from_history[i] = learned[pair] or 1, learned[pair] and true
  end
  if not est or est ~= est or est < 0 or est > 1e10 then return {1, i, 'est_s must be 0..1e10 or empty'} end
  local d = deadline ~= '' and tonumber(deadline)
  if deadline ~= '' and not (d and d > 0 and d <= 1e13) then  -- 1e13 ms: about 300 years
    return {1, i, 'deadline must be ms > 0 or empty'}
  end
  -- only the producer's own est_s is held against its deadline: a learned one, or the 1 s
  -- taken where none is known, is the pool's guess
  if d and est * 1000 > d and ARGV[o + 7] ~= '' then
    return {1, i, 'deadline is shorter than est_s: the task could not end in time'}
  end
  if pre ~= '0' and pre ~= '1' then return {1, i, 'preemptible must be 0 or 1'} end
  local report = ARGV[o + 12]
  if report ~= '0' and report ~= '1' then return {1, i, 'report_end must be 0 or 1'} end
  if not attempts or attempts < 1 or attempts > 100 or attempts % 1 ~= 0 then
    return {1, i, 'max_attempts must be an integer in 1..100'}
  end
  if not gpus or gpus < 1 or gpus > 64 or gpus % 1 ~= 0 then
    return {1, i, 'gpus must be an integer in 1..64'}
  end
  if #payload > 1048576 then return {1, i, 'payload is larger than 1048576 bytes'} end
  if not is_json(payload) then return {1, i, 'payload is not valid JSON'} end
  local taken = i > 1 and redis.call('EXISTS', task_key(id)) == 1 or i == 1 and first_taken
  if seen[id] or taken then return {2, i, id} end
  seen[id] = true
  if check_fit then
    local largest = largest_with(classes, gpus)
    if vram > largest then
      return {3, i, tostring(vram), tostring(largest), tostring(gpus), tostring(most_gpus)}
    end
    if registered[handler] == nil then
      registered[handler] = redis.call('SISMEMBER', K_HANDLERS, handler) == 1
    end
    if not registered[handler] then return {7, i, handler} end
  end
  local why = tenancy and past_caps(tenant, quota_of(tenant), gpus, vram, ARGV[o + 5])
  if why then return {1, i, why} end
  vrams[i], ests[i], tries[i], gpus_of[i] = vram, est, attempts, gpus
  if tenancy then work[tenant] = (work[tenant] or 0) + est end
  local later, why = false, nil  -- due, after, after_any as most tasks send them: queued now
  if ARGV[o + 14] ~= '' or ARGV[o + 15] ~= '' or ARGV[o + 16] ~= '0' then
    later, why = deferral(id, ARGV[o + 14], ARGV[o + 15], ARGV[o + 16], seen)
  end
  if later == nil then return {1, i, why} end
  held[i] = later or nil
  if not later or later.ready then ready[#ready + 1] = i end
end

local function add(h, field, value) local n = #h; h[n + 1] = field; h[n + 2] = value; return h end
-- arrived: the models in order of first arrival, and model -> tasks (lib/arrivals.lua)
local unwoken, targeted, heads, urgent, arrived = 0, 0, {}, false, {}
local now_ms = ms(now)
for r = 1, #ready do
  local i = ready[r]
  local o = 3 + (i - 1) * G
  local id, model, prio, deadline = ARGV[o + 1], ARGV[o + 4], ARGV[o + 6], ARGV[o + 8]
  local vram = vrams[i]
  if not arrived[model] then arrived[#arrived + 1] = model end
  arrived[model] = (arrived[model] or 0) + 1
  local score = now + sla[prio]
  if deadline ~= '' then
    deadline = now + math.max(1, math.floor(tonumber(deadline)))
    score = math.min(score, deadline - math.floor(ests[i] * 1000))
    deadline = ms(deadline)
  end
  local w, idle, warm = pick(model, vram, prio, idle_n, gpus_of[i], now)
  -- a call of one task may hand it over; a bulk call's tasks are queued and their workers
  -- woken, so each claim picks the best of the batch (the first task need not be it)
  local tenant = ARGV[o + 10]
  -- a cold P2/P3 task is not handed over while a busy holder of its model could take it: the
  -- claim applies the holder wait (batch work waits for a busy holder rather than load cold)
  local hand = idle and n == 1 and not (tenancy and quota_of(tenant))
    and (warm or prio == '0' or prio == '1' or not busy_holders_of(model, vram, prio, w, gpus_of[i])[1])
    and handover(w)
  if idle then
    targeted, idle_n = 1, idle_n - 1
  else
    unwoken = unwoken + 1
    urgent = urgent or prio == '0' or prio == '1'
  end
  -- numbers formatted once (a float's formatting costs as much as a command), normalized
  local order = score
  if tenancy and not hand then
    order = fair_order(now, prio, tenant, score, sla[prio], ests[i], vram, gpus_of[i])
  end
  -- a whole number's text as tostring makes it (%.14g), by ms (%d: the same below 1e14)
  local est_s = ests[i] > 0 and ests[i] % 1 == 0 and ests[i] < 1e14 and ms(ests[i]) or tostring(ests[i])
  local vram_s = vram % 1 == 0 and vram < 1e14 and ms(vram) or tostring(vram)
  local score_ms = ms(score)
  local order_ms = order == score and score_ms or ms(order)  -- a text made once: ms keeps the last
  -- optional fields only when there is one: each costs about a small command (PROTOCOL). State
  -- and priority first: a small hash is a list that each field's lookup walks from its start,
  -- and every later script of the task reads or writes state (ack reads priority too)
  local h = {'state', 'queued', 'priority', prio, 'id', id, 'handler', ARGV[o + 2],
    'payload', ARGV[o + 3], 'model', model, 'vram_gb', vram_s, 'est_s', est_s,
    'preemptible', ARGV[o + 9], 'tenant', ARGV[o + 10],
    'max_attempts', ms(tries[i]), 'score', score_ms, 'enqueued_at', now_ms, 'queued_at', now_ms}
  if deadline ~= '' then add(h, 'deadline', deadline) end
  if ARGV[o + 12] == '1' then add(h, 'report_end', '1') end
  if from_history[i] then add(h, 'est_from', 'history') end
  if gpus_of[i] > 1 then add(h, 'gpus', ARGV[o + 13]) end
  if w and not hand then add(h, 'offered', w) end
  if tenancy and not hand then add(add(h, 'order', order_ms), 'fair', prio .. ':' .. tenant) end
  redis.call('HSET', task_key(id), unpack(h))  -- one write, the optional fields included
  if hand then
    -- handed over: started here as a claim would, with the worker's lease; unread on its wake
    -- list at its pickup deadline (the offer's defer bound), a claim or the reaper takes it back
    local pickup = now + math.min(hand.defer, math.floor(sla[prio] / 2))
    redis.call('ZREM', K_IDLE, w)
    -- its SLA is left to began, which the worker calls as its handler starts (warm or
    -- cold): a hand-over taken back never started there, and must not count as met
    local token = start(id, prio, model, w, now, now + hand.lease, '1', score, now, true, false, false)
    if not warm then note_cold_start(id, model, now) end
    redis.call('ZADD', K_HANDED, ms(pickup), id)
    gate_before('pickup_at', pickup)
    count_dispatch(tonumber(prio), redis.call('HMGET', K_FAIRNESS, '1', '2', '3'), hand.fair_every)
    redis.call('LPUSH', wake_key(w), cjson.encode({id = id, token = tostring(token),
      handler = ARGV[o + 2], payload = ARGV[o + 3], model = model, vram_gb = vram_s,
      priority = prio, est_s = est_s, attempt = '1', deadline = deadline, tenant = ARGV[o + 10],
      checkpoint = '', enqueued_at = now_ms, queued_at = now_ms, started_at = now_ms,
      sla = 'pending', pickup_by = ms(pickup)}))
  else
    if idle then wake_worker(w) end
    redis.call('ZADD', queue_key(prio, model), order_ms, id)
    redis.call('ZADD', K_NEED, need_score(vrams[i], vram_s, gpus_of[i]), id)
    watch_deadline(id, deadline, ests[i])
    local qk = prio .. ':' .. model  -- the index needs each queue's lowest new score once
    if not heads[qk] then  -- also listed in order: no pairs() walk below
      heads[qk] = {prio, model, order, order_ms}
      heads[#heads + 1] = heads[qk]
    elseif order < heads[qk][3] then heads[qk][3], heads[qk][4] = order, order_ms end
  end
end
for k = 1, #heads do index_head(heads[k][1], heads[k][2], heads[k][3], heads[k][4]) end
for i = 1, n do  -- held tasks (lib/defer.lua), in call order
  local o = 3 + (i - 1) * G
  if held[i] then
    hold(ARGV[o + 1], {'id', ARGV[o + 1], 'handler', ARGV[o + 2], 'payload', ARGV[o + 3], 'model', ARGV[o + 4],
      'vram_gb', tostring(vrams[i]), 'priority', ARGV[o + 6], 'est_s', tostring(ests[i]),
      'preemptible', ARGV[o + 9], 'tenant', ARGV[o + 10], 'max_attempts', ms(tries[i]),
      'enqueued_at', ms(now), 'queued_at', ms(now), 'report_end', ARGV[o + 12],
      'est_from', from_history[i] and 'history' or '', 'gpus', ARGV[o + 13]}, held[i], now, sla[ARGV[o + 6]],
      tonumber(ARGV[o + 8]), ests[i], tenancy)
  end
end
if tenancy then fair_flush() end  -- without tenancy nothing was added to flush
count_arrivals(now, arrived)
-- while other workers idle, pool-wide wakes for the tasks no idle worker was picked for, and
-- one in case a picked worker died idle (its offer lapses after the defer bound); none while
-- nobody idles: only idle workers wait on the lists, and a busy one claims when it is done
if idle_n > 0 and unwoken + targeted > 0 then wake_pool(unwoken + targeted) end
-- online or nearline work no idle worker can take: wake the reaper to plan a preemption now
-- rather than at its next round (one token: it plans for every waiting task at once)
if urgent then
  redis.call('LPUSH', K_URGENT, '1')
  redis.call('LTRIM', K_URGENT, 0, 0)
end
redis.call('HINCRBY', K_STATS, 'enqueued', ms(n))
return {0, n}
