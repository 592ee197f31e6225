-- cancel.lua: end a task as "canceled" wherever it is. A running task's lease is dropped,
-- so its ack is rejected, and its worker is told at once ("lost <id> <token>" on its control
-- list: the handler sees should_stop; its next heartbeat would report it lost); one handed over at
-- enqueue and still unread on its worker's wake list leaves that list. A waiting task
-- (enqueued with `after`) leaves `waiting`; its parents' release skips it. Its own waiting
-- children are canceled in turn (lib/finish.lua, lib/deps.lua).
--
-- KEYS[1]  pool key base
-- ARGV[1]  task id
-- ARGV[2]  now (ms; "0" = server clock)
-- ARGV[3]  result TTL (ms)
-- Returns  {0, previous_state} | {4} NOT_FOUND | {6, state} FINISHED (already ended)
--          {1, 0, reason} INVALID: a malformed argument (nothing written)
-- A hash corrupt in its state (none of the above) counts as ended: FINISHED.

--@include args
--@include queue
--@include reserve
--@include finish
--@include tenancy
--@include due

if #ARGV ~= 3 then return {1, 0, 'expected 3 arguments'} end
local id, now, ttl = ARGV[1], clock(ARGV[2]), ttl_arg(3)
if not (now and ttl) then return {1, 0, 'now and ttl must be ms >= 0'} end
local f = redis.call('HMGET', task_key(id), 'state', 'priority', 'model', 'worker', 'reserved_for',
  'yield_victim', 'charged', 'fair', 'parked', 'token')
local state = f[1]
if not state then return {4} end
if state == 'queued' then
  if f[9] then unpark(id) end  -- out of its queue (park.lua)
  if f[2] and f[3] then
    unqueue(id, f[2], f[3])
    fair_leave(id, f[8])
  else  -- a corrupt hash: its queue's entry goes at the next claim that meets it
    redis.call('ZREM', K_NEED, id)
    redis.call('ZREM', K_DEADLINES, id)
  end
  withdraw_yield(id, f[5], f[6], now)
elseif state == 'delayed' then
  redis.call('ZREM', K_DELAYED, id)
elseif state == 'waiting' then  -- its parents' release skips it: it no longer waits
  redis.call('ZREM', K_WAITING, id)
elseif state == 'running' then
  release(id, f[4], f[7])
  -- handed over at enqueue and not yet popped: its worker must not start it
  local msg = f[4] and f[4] ~= '' and unread_handover(f[4], id)
  if msg then
    redis.call('LREM', wake_key(f[4]), 1, msg)
  elseif f[4] and f[4] ~= '' then
    tell_lost(f[4], id, f[10])
  end
else
  return {6, state}
end
finish(id, 'canceled', now, ttl, 'error', 'canceled')
return {0, state}
