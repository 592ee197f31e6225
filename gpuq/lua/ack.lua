-- ack.lua: record a task's result, fenced by its lease token, and wake its waiters.
--
-- A task that streamed (`streamed`, read with the lease) gets its stream's end marker and a
-- parent's waiting children are released (lib/finish.lua, lib/deps.lua) in the same call: the
-- two fields read with the others are all a task that did neither pays.
--
-- It learns nothing: the worker times its handler and sends the run, once acked, to
-- learn.lua with its next heartbeat (`runtimes`), so a task's own path costs no more.
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

if #ARGV ~= 5 then return {1, 0, 'expected 5 arguments'} end
local id, token, now, ttl = ARGV[1], ARGV[2], clock(ARGV[3]), ttl_arg(5)
if not (now and ttl) then return {1, 0, 'now and ttl must be ms >= 0'} end
local f = redis.call('HMGET', task_key(id), 'state', 'token', 'worker', 'priority', 'charged',
  'streamed', 'children')
if not f[1] then return {4} end
if f[1] ~= 'running' or f[2] ~= token then return {5, f[1]} end
if #ARGV[4] > 1048576 then return {1, 0, 'result is larger than 1048576 bytes'} end
if not is_json(ARGV[4]) then return {1, 0, 'result is not valid JSON'} end
release(id, f[3], f[5])
finish(id, 'succeeded', now, ttl, 'result', ARGV[4], f[4], f[6], f[7])  -- releases its children
return {0}
