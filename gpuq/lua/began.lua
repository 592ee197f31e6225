-- began.lua: a task's handler starts after a cold model load, or a hand-over's: decide its SLA.
--
-- A claim that starts a task on a worker without its model leaves the task's SLA undecided
-- (reply sla "pending"): its handler starts only after the load; so does every hand-over,
-- which may yet be taken back (lib/due.lua): this call takes it up (it leaves `handed`).
-- The worker calls this just before the handler. Fenced by the token: a task requeued meanwhile (a
-- yield during the load, a stop, a lost lease) is not counted here, and stays undecided
-- for its next start. A cold start's `loading` ends here, `ready_at` now (every cold start
-- calls this, decided or not). Counted once per task (began_at), as claim counts a warm start:
-- stats sla_met:P<n> or sla_missed:P<n> (the handler started by the task's start-by score
-- or not); a miss is noted in `misses` (kind "cold", or "late" when it was started after
-- its score or its handler started without a load: a warm hand-over taken up late).
--
-- KEYS[1]  pool key base
-- ARGV[1]  task id
-- ARGV[2]  fencing token
-- ARGV[3]  now (ms; "0" = server clock)
-- ARGV[4]  warm (optional): "1" when no model load came before the handler (a warm hand-over)
-- Returns  {0, result, now_ms}  result "met" or "missed" (decided now), or "" (decided
--                               before, or the hash's times are malformed: nothing counted);
--                               now_ms: the time used (the worker's latency metric)
--          {1, 0, reason}       INVALID: a malformed argument (nothing written)
--          {4}                  NOT_FOUND
--          {5, state}           STALE_LEASE: the task is no longer running under this token

--@include args
--@include start
--@include tenancy

if #ARGV ~= 3 and #ARGV ~= 4 then return {1, 0, 'expected 3 or 4 arguments'} end
local id, token, now, warm = ARGV[1], ARGV[2], clock(ARGV[3]), ARGV[4] == '1'
if not now then return {1, 0, 'now must be ms >= 0'} end
local tk = task_key(id)
local f = redis.call('HMGET', tk, 'state', 'token', 'priority', 'model', 'score', 'enqueued_at',
  'started_at', 'began_at', 'tenant', 'due_at', 'loading')
if not f[1] then return {4} end
if f[1] ~= 'running' or f[2] ~= token then return {5, f[1]} end
redis.call('ZREM', K_HANDED, id)  -- a hand-over: its worker took it up (lib/due.lua)
-- its load is over: the planner counts its work from now (lib/start.lua note_cold_start)
if f[11] == '1' then redis.call('HSET', tk, 'loading', '', 'ready_at', ms(now)) end
local p, score, enqueued, started = level(f[3]), finite(f[5]), finite(f[6]), finite(f[7])
if (f[8] and f[8] ~= '') or not (p and f[4] and score and enqueued and started) then
  return {0, '', ms(now)}
end
redis.call('HSET', tk, 'began_at', ms(now))
-- a warm start's delay was its taking up, not a load: it counts as started now
local result = decide_sla(id, p, f[4], now, score, finite(f[10]) or enqueued,  -- due: delayed
  warm and now or started)
if tenancy_on() then count_tenant_sla(p, f[9], result) end
return {0, result, ms(now)}
