-- ack.lua: record a task's result, fenced by its lease token, and wake its waiters.
--
-- Its run time, from its handler's start to now, is added to `runtimes` for its handler and
-- model (note_runtime below). The handler started at began_at when that is of this run (not
-- before started_at: a first start), else, on a cold start, at ready_at (the expected end of
-- the model load) when it lies between started_at and now, else at started_at.
--
-- KEYS[1]  pool key base
-- ARGV[1]  task id
-- ARGV[2]  fencing token from the claim
-- ARGV[3]  now (ms; "0" = server clock)
-- ARGV[4]  result (JSON text)
-- ARGV[5]  result TTL (ms): how long the ended task stays readable
-- Returns  {0}        succeeded
--          {1, 0, reason} INVALID: a malformed argument, or the result is larger than
--                     1048576 bytes or not JSON text (nothing written; the task keeps running)
--          {4}        NOT_FOUND
--          {5, state} STALE_LEASE: the task is no longer running under this token

--@include args
--@include json
--@include finish
--@include runtime

local RUNTIME_WEIGHT = 0.1  -- a new sample's weight once 10 are in: the decayed memory
local RUNTIME_PAIRS = 4096  -- pairs kept: a new pair past this many is not recorded

-- Add one successful run of x seconds. Mean: an exponentially decayed mean, weight
-- max(0.1, 1/n) (the plain mean of the first 10 runs, then 0.1). p90: a stochastic-
-- approximation step towards the 0.9 quantile, scaled by the mean: up 0.9·s when x is above
-- it, down 0.1·s otherwise (s = the same weight × the mean), so it settles where one run in
-- ten lies above it; the first run starts it at x. A malformed value starts afresh.
local function note_runtime(h, m, x)
  local field = runtime_field(h, m)
  local v = redis.call('HGET', K_RUNTIMES, field)
  local mean, p90, n = read_runtime(v)
  if not mean then
    if not v and redis.call('HLEN', K_RUNTIMES) >= RUNTIME_PAIRS then return end
    mean, p90, n = x, x, 1
  else
    n = n + 1
    local a = math.max(RUNTIME_WEIGHT, 1 / n)
    mean = mean + a * (x - mean)
    local step = a * mean
    if x > p90 then p90 = p90 + 0.9 * step else p90 = math.max(0, p90 - 0.1 * step) end
  end
  redis.call('HSET', K_RUNTIMES, field, string.format('%.6g %.6g %d', mean, p90, n))
end

if #ARGV ~= 5 then return {1, 0, 'expected 5 arguments'} end
local id, token, now, ttl = ARGV[1], ARGV[2], clock(ARGV[3]), ttl_arg(5)
if not (now and ttl) then return {1, 0, 'now and ttl must be ms >= 0'} end
local f = redis.call('HMGET', task_key(id), 'state', 'token', 'worker', 'priority', 'handler',
  'model', 'started_at', 'began_at', 'ready_at')
if not f[1] then return {4} end
if f[1] ~= 'running' or f[2] ~= token then return {5, f[1]} end
if #ARGV[4] > 1048576 then return {1, 0, 'result is larger than 1048576 bytes'} end
if not is_json(ARGV[4]) then return {1, 0, 'result is not valid JSON'} end
local started, began, ready = finite(f[7]), finite(f[8]), finite(f[9])
if started and f[5] and f[6] then  -- a corrupt hash teaches nothing
  local from = (began and began >= started) and began
    or (ready and ready >= started and ready <= now) and ready or started
  if now >= from then note_runtime(f[5], f[6], (now - from) / 1000) end
end
release(id, f[3])
finish(id, 'succeeded', now, ttl, 'result', ARGV[4], f[4])
return {0}
