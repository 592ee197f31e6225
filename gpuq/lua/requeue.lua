-- requeue.lua: return a running task to its queue (worker shutdown, yield, operator).
--
-- With a token the call is fenced like an ack; with token "" it is an operator's requeue
-- of whatever runs now. The attempt is given back unless consume is "1".
--
-- KEYS[1]  pool key base
-- ARGV[1]  task id
-- ARGV[2]  fencing token, or "" (operator)
-- ARGV[3]  now (ms; "0" = server clock)
-- ARGV[4]  reason (kept in the task's error field)
-- ARGV[5]  consume: "1" counts the attempt
-- ARGV[6]  result TTL (ms), used if a consumed attempt was the last
-- Returns  {0, "queued" | "failed"}
--          {4} NOT_FOUND | {5, state} STALE_LEASE

local id, token, now = ARGV[1], ARGV[2], clock(ARGV[3])
local f = redis.call('HMGET', task_key(id), 'state', 'token')
if not f[1] then return {4} end
if f[1] ~= 'running' or (token ~= '' and f[2] ~= token) then return {5, f[1]} end
return {0, requeue(id, now, ARGV[4], ARGV[5] == '1', tonumber(ARGV[6]))}
