-- preempt.lua: commit one decision of the reaper's preemption planner, if it still holds.
--
-- The planner (gpuq/reaper/preempt.py) chose, for a waiting P0/P1 task that fits no idle worker, a
-- running lower-priority task (the victim) on a worker large enough. Either way the worker is
-- reserved for the waiting task (reserve:<worker>, until now + lifetime): its next claim takes that
-- task; reserve only: the worker's control list gets "reserved <waiting>" (a batch waiting for
-- more tasks runs at once). With yield, the victim is also asked to give way: its hash gets
-- yield_by (deadline, ms) and yield_for, and the worker's control list gets
-- "yield <victim> <grace_ms>", which its heartbeat thread reads at once.
--
-- KEYS[1]  pool key base
-- ARGV[1]  now (ms; "0" = server clock)
-- ARGV[2]  waiting task id
-- ARGV[3]  worker id
-- ARGV[4]  victim task id
-- ARGV[5]  victim's fencing token
-- ARGV[6]  reservation lifetime (ms)
-- ARGV[7]  grace (ms) the victim has to yield; "" = reserve only (the victim ends soon)
-- ARGV[8..] pairs: further victims on the same worker (id, token), where no one's end alone
--           makes room (a group, or a worker with several slots): each asked, or waited for
-- Counts   stats preempt:<reserved|yield_requested> and the same per victim priority (:P<n>)
-- Returns  {0, "reserved" | "yield"}
--          {0, "stale", why}   the pool changed since the plan: nothing was written
--          {1, 0, reason}      INVALID: a malformed argument (nothing written)

--@include args
--@include reserve

if #ARGV < 7 or #ARGV % 2 == 0 then return {1, 0, 'expected 7 arguments, then id, token pairs'} end
local now, waiting, worker = clock(ARGV[1]), ARGV[2], ARGV[3]
local life, grace = arg_num(6, 0, 1e12, true), ARGV[7]
if grace ~= '' then grace = arg_num(7, 0, 1e12, true) end
if not (now and life and grace) then return {1, 0, 'now, lifetime and grace must be ms >= 0'} end
if worker == '' or string.find(waiting, '[%s{},]') or waiting == '' then
  return {1, 0, 'worker and waiting task must be names'}
end
if redis.call('HGET', task_key(waiting), 'state') ~= 'queued' then
  return {0, 'stale', 'waiting task is no longer queued'}
end
local alive = redis.call('ZSCORE', K_WORKERS, worker)
if not alive or tonumber(alive) < now then return {0, 'stale', 'worker is not live'} end
local pairs_at = {4}  -- where each victim's id, token pair is
for i = 8, #ARGV, 2 do pairs_at[#pairs_at + 1] = i end
local victims, prio = {}, {}  -- every victim checked before anything is written
for k, i in ipairs(pairs_at) do
  local id, tok = ARGV[i], ARGV[i + 1]
  if k > 1 and (id == '' or string.find(id, '[%s{},]')) then return {1, 0, 'victims must be task ids'} end
  local v = redis.call('HMGET', task_key(id), 'state', 'token', 'worker', 'yield_by', 'priority')
  if v[1] ~= 'running' or v[2] ~= tok or v[3] ~= worker then
    return {0, 'stale', 'victim is no longer running there'}
  end
  if v[4] and v[4] ~= '' then return {0, 'stale', 'victim was already asked to yield'} end
  victims[k], prio[k] = id, v[5]
end
if reserved_task(worker, now) then return {0, 'stale', 'worker is already reserved'} end
redis.call('SET', reservation_key(worker), waiting .. ' ' .. ms(now + life))
-- the claims' gate (lib/gates.lua) at or after every reservation's expiry
local gate = finite(redis.call('HGET', K_FAIRNESS, 'reserved_until'))
if not gate or now + life > gate then redis.call('HSET', K_FAIRNESS, 'reserved_until', ms(now + life)) end
redis.call('HSET', task_key(waiting), 'reserved_for', worker)
if grace == '' then
  -- a batch waiting to fill up on that worker runs now, not after its batch wait
  redis.call('LPUSH', control_key(worker), 'reserved ' .. waiting)
  redis.call('HINCRBY', K_STATS, 'preempt:reserved', 1)
  if level(prio[1]) then redis.call('HINCRBY', K_STATS, 'preempt:reserved:P' .. prio[1], 1) end
  return {0, 'reserved'}
end
for k, id in ipairs(victims) do
  redis.call('HSET', task_key(id), 'yield_by', ms(now + grace), 'yield_for', waiting)
  redis.call('LPUSH', control_key(worker), 'yield ' .. id .. ' ' .. ms(grace))
  redis.call('HINCRBY', K_STATS, 'preempt:yield_requested', 1)
  if level(prio[k]) then redis.call('HINCRBY', K_STATS, 'preempt:yield_requested:P' .. prio[k], 1) end
end
-- the victims asked for it, space-separated (lib/reserve.lua withdraws each)
redis.call('HSET', task_key(waiting), 'yield_victim', table.concat(victims, ' '))
return {0, 'yield'}
