-- claim_batch.lua: add queued tasks of a batch handler to the batch a worker just claimed.
--
-- A claim that takes a batch handler's task on a model the worker holds takes the batch's
-- first tasks itself (claim.lua); a worker calls this for more: when the batch is still short
-- after its batch_wait_ms, or when its first task started cold (or was handed over at
-- enqueue). It takes up to `count` more queued tasks of the same handler and model from the
-- first task's own queue q:<p>:<model>, so a lower level is never mixed in ahead of a higher
-- one, by lib/batch.lua's rule (oldest first, at most `scan` ids examined, each started as
-- claim starts one, working memory fitting the free VRAM left, no model evicted); a task
-- asking more GPUs than the first (which fit this worker's group) is passed over. Each task
-- taken counts as one dispatch for the fairness rule.
--
-- KEYS[1]  pool key base
-- ARGV[1]  worker id
-- ARGV[2]  now (ms; "0" = server clock)
-- ARGV[3]  free VRAM (GB) the worker has left with the batch's tasks so far reserved
-- ARGV[4]  lease (ms)
-- ARGV[5]  fair_every (N: one lower dispatch after N higher ones)
-- ARGV[6]  the batch's first task id (claimed by this worker: its level, model, handler)
-- ARGV[7]  its fencing token
-- ARGV[8]  footprint (GB) of the model on this worker
-- ARGV[9]  "1": the worker held the model when it claimed the first task (a warm start: SLAs
--          decided here); "0": it loads it for the batch (sla "pending", as claim)
-- ARGV[10] count: tasks to take at most (0..1e4)
-- ARGV[11] scan: task ids examined at most (1..1e5)
-- Returns  {0, left_ms, started_at, task, ...}  left_ms: ms from now to the batch's
--                                   earliest start-by score (the first task's and those
--                                   taken; < 0: past it); started_at: now (ms), when each
--                                   started; each task the values of the claim reply's
--                                   pairs but handler, model, priority (the first's) and
--                                   started_at, in their order (id, token, payload, vram_gb,
--                                   est_s, attempt, deadline, tenant, checkpoint,
--                                   enqueued_at, queued_at, sla)
--          {1, 0, reason}           INVALID: a malformed argument (nothing written)
--          {4}                      NOT_FOUND: the first task is gone (nothing taken)
--          {5, state}               STALE_LEASE: the first task no longer runs under this
--                                   worker and token (nothing taken)

--@include args
--@include queue
--@include tenancy
--@include start
--@include batch

if #ARGV ~= 11 then return {1, 0, 'expected 11 arguments'} end
local worker, now = ARGV[1], clock(ARGV[2])
local free, lease, fair_every = arg_num(3, -1e9, 1e9), arg_num(4, 0, 1e12, true), arg_num(5, 1, 1e9, true)
local first, token, footprint = ARGV[6], ARGV[7], arg_num(8, 0, 1e9)
local count, scan = arg_num(10, 0, 1e4, true), arg_num(11, 1, 1e5, true)
if worker == '' or first == '' then return {1, 0, 'worker and first task ids must not be empty'} end
if not now then return {1, 0, 'now must be ms >= 0'} end
if not (free and lease and fair_every and footprint and count and scan) then
  return {1, 0, 'free and footprint GB, lease, fair_every, count and scan must be numbers in range'}
end
if ARGV[9] ~= '0' and ARGV[9] ~= '1' then return {1, 0, 'warm must be 0 or 1'} end
local warm = ARGV[9] == '1'
-- a task it fails for a corrupt hash stays readable for the default result TTL, as claim's
local TTL = '604800000'

local s = redis.call('HMGET', task_key(first), 'state', 'token', 'worker', 'priority', 'model',
  'handler', 'score', 'gpus')
if not s[1] then return {4} end
if s[1] ~= 'running' or s[2] ~= token or s[3] ~= worker then return {5, s[1]} end
local p, m, h, bound = tonumber(level(s[4])), s[5], s[6], finite(s[7])
-- a task asking no more GPUs than the first fits this worker's group as the first did
local gpus = tonumber(s[8]) or 1
if not (p and m and h and bound) then return {0, 0, ms(now)} end  -- claim checked them: never here

local tenancy = tenancy_on()
local reply = {0, 0, ms(now)}
local taken, used, seen
taken, used, bound, seen = take_batch(p, m, h, gpus, worker, now, now + lease, free, footprint, warm, count,
  scan, tenancy, TTL, bound, reply)
-- the batch's dispatches count for fairness, and its queue's head moves, once for all
if taken > 0 then count_dispatch(p, redis.call('HMGET', K_FAIRNESS, '1', '2', '3'), fair_every, taken) end
if seen then refresh_head(p, m) end
-- a worker with slots left stays in `idle`, scored by what it can still claim
if used > 0 and redis.call('ZSCORE', K_IDLE, worker) then
  redis.call('ZINCRBY', K_IDLE, -used, worker)
end
reply[2] = bound - now
return reply
