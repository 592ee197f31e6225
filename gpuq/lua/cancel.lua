-- cancel.lua: end a task as "canceled" wherever it is. A running task's lease is dropped,
-- so its worker's next heartbeat reports it lost and its ack is rejected.
--
-- KEYS[1]  pool key base
-- ARGV[1]  task id
-- ARGV[2]  now (ms; "0" = server clock)
-- ARGV[3]  result TTL (ms)
-- Returns  {0, previous_state} | {4} NOT_FOUND | {6, state} FINISHED (already ended)

local id, now = ARGV[1], clock(ARGV[2])
local f = redis.call('HMGET', task_key(id), 'state', 'priority', 'model', 'worker', 'reserved_for',
  'yield_victim')
local state = f[1]
if not state then return {4} end
if state == 'queued' then
  unqueue(id, f[2], f[3])
  withdraw_yield(id, f[5], f[6], now)
elseif state == 'delayed' then
  redis.call('ZREM', K_DELAYED, id)
elseif state == 'running' then
  release(id, f[4])
else
  return {6, state}
end
finish(id, 'canceled', now, tonumber(ARGV[3]), 'error', 'canceled')
return {0, state}
