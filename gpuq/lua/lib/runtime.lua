-- lib/runtime.lua: run times learned per (handler, model) from successful runs (learn.lua
-- writes them, sent by workers' heartbeat threads), for tasks enqueued without est_s
-- (enqueue.lua reads them).
--
-- `runtimes` field "<handler> <model>" (names hold no whitespace), value "<mean_s> <p90_s>
-- <samples>" (%.6g seconds, an integer count). The update rule lives in learn.lua, its one
-- user (a helper only one script calls lives in that script).

--@include args

local function runtime_field(h, m) return h .. ' ' .. m end

-- The stored (mean, p90, samples) of a field's value, or nil when absent or malformed.
local function read_runtime(v)
  if not v then return nil end
  local a, b, c = string.match(v, '^(%S+) (%S+) (%d+)$')
  local mean, p90, n = finite(a), finite(b), tonumber(c)
  if not (mean and p90 and n) or mean < 0 or p90 < 0 or mean > 1e10 or n < 1 then return nil end
  return mean, p90, n
end
