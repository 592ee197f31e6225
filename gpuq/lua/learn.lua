-- learn.lua: add measured run times of successful runs to `runtimes`, per handler and model.
--
-- A worker times each handler (from its start, with its model loaded, to its return), keeps
-- the runs whose ack succeeded and sends them with its heartbeat thread, once a beat and once
-- when it stops (gpuq/worker/runtimes.py): no script on a task's own path writes `runtimes`.
-- Runs are added one by one in the order sent (note_runtime below); each pair is read once
-- and written once per call, its numbers kept unrounded between the runs of one call.
--
-- KEYS[1]  pool key base
-- ARGV[1]  a run's handler, ARGV[2] its model (non-empty names without whitespace), ARGV[3]
--          its seconds (a decimal number 0..1e10); then the next runs, three fields each, at
--          most 256 runs
-- Returns  {0, n}     n runs recorded (the rest were of new pairs past the 4096 kept)
--          {1, 0, reason} INVALID: not triples, more than 256 runs, or a malformed name or
--                     number (nothing written)

--@include runtime

local RUNTIME_WEIGHT = 0.1  -- a new sample's weight once 10 are in: the decayed memory
local RUNTIME_PAIRS = 4096  -- pairs kept: a new pair past this many is not recorded
local MAX_RUNS = 256  -- per call: the worker sends the rest in later calls

if #ARGV % 3 ~= 0 then return {1, 0, 'expected handler, model, seconds triples'} end
if #ARGV > 3 * MAX_RUNS then return {1, 0, 'at most 256 runs per call'} end
-- every run checked before any write; a call repeats a few names, each checked once
local named, fields, seconds = {}, {}, {}
for i = 1, #ARGV, 3 do
  local h, m, x = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  if not (named[h] and named[m]) then
    if h == '' or m == '' or string.find(h, '%s') or string.find(m, '%s') then
      return {1, 0, 'handler and model must be non-empty names without whitespace'}
    end
    named[h], named[m] = true, true
  end
  -- nan fails both comparisons, inf and 1e309 the second
  if not (x and x >= 0 and x <= 1e10) then return {1, 0, 'seconds must be a number 0..1e10'} end
  fields[#fields + 1], seconds[#seconds + 1] = runtime_field(h, m), x
end

local state, order = {}, {}  -- field -> {mean, p90, n} ({}: none yet; false: past the cap)
local count  -- HLEN, read once a new pair is met, counting the pairs this call adds

-- Add one successful run of x seconds. Mean: an exponentially decayed mean, weight
-- max(0.1, 1/n) (the plain mean of the first 10 runs, then 0.1). p90: the largest of the first
-- 10 runs (their 0.9 quantile: a smaller step than that showed a p90 below every run of two),
-- then a stochastic-approximation step towards the 0.9 quantile, scaled by the mean: up 0.9·s
-- when x is above it, down 0.1·s otherwise (s = the same weight × the mean), so it settles
-- where one run in ten lies above it. A malformed value starts afresh.
local function note_runtime(field, x)
  local s = state[field]
  if s == nil then
    local v = redis.call('HGET', K_RUNTIMES, field)
    local mean, p90, n = read_runtime(v)
    if mean then
      s = {mean, p90, n}
    elseif v then
      s = {}
    else
      count = count or redis.call('HLEN', K_RUNTIMES)
      s = count < RUNTIME_PAIRS and {}
      if s then count = count + 1 end
    end
    state[field] = s
    if s then order[#order + 1] = field end
  end
  if not s then return 0 end
  if not s[3] then
    s[1], s[2], s[3] = x, x, 1
    return 1
  end
  local n = s[3] + 1
  local a = math.max(RUNTIME_WEIGHT, 1 / n)
  local mean, p90 = s[1] + a * (x - s[1]), s[2]
  local step = a * mean
  if n * RUNTIME_WEIGHT <= 1 then p90 = math.max(p90, x)  -- the first 10
  elseif x > p90 then p90 = p90 + 0.9 * step else p90 = math.max(0, p90 - 0.1 * step) end
  s[1], s[2], s[3] = mean, p90, n
  return 1
end

local recorded = 0
for k, field in ipairs(fields) do recorded = recorded + note_runtime(field, seconds[k]) end
if #order > 0 then
  local args = {}
  for _, field in ipairs(order) do
    local s = state[field]
    args[#args + 1], args[#args + 2] = field, string.format('%.6g %.6g %d', s[1], s[2], s[3])
  end
  redis.call('HSET', K_RUNTIMES, unpack(args))
end
return {0, recorded}
