-- ack.lua: record a task's result, fenced by its lease token, and wake its waiters.
--
-- A task that streamed (`streamed`, read with the lease) gets its stream's end marker, a
-- parent's waiting children are released and a waited task's done list is pushed
-- (lib/finish.lua, lib/deps.lua, wait.lua) in the same call: the three fields read with the
-- others are all a task that did none of these pays.
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
-- ARGV[6..]  triples: task id, token, result, for more tasks acked at the same now and TTL
--            (a batch's tasks, settled together: one call instead of one each)
-- Returns  {0}        succeeded
--          {1, 0, reason} INVALID: a malformed argument, or the result is larger than
--                     1048576 bytes or not JSON text (nothing written; the task keeps running)
--          {4}        NOT_FOUND
--          {5, state} STALE_LEASE: the task is no longer running under this token
--          With triples: {0} when every task was acked, else one such reply per task, in
--          order, each task acked or not on its own (INVALID for a malformed now or TTL, or a
--          short triple, is the call's). One {0} for all: a batch's usual answer is then one
--          element, where a reply a task cost the server a table and its conversion and the
--          worker a list to read, for each task.

--@include args
--@include json
--@include finish
--@include tally

if #ARGV < 5 or (#ARGV - 5) % 3 ~= 0 then return {1, 0, 'expected 5 arguments, then id, token, result triples'} end
local now, ttl = clock(ARGV[3]), ttl_arg(5)
if not (now and ttl) then return {1, 0, 'now and ttl must be ms >= 0'} end

local function ack(id, token, result)
  local f = redis.call('HMGET', task_key(id), 'state', 'token', 'worker', 'priority', 'charged',
    'streamed', 'children', 'waited')
  if not f[1] then return {4} end
  if f[1] ~= 'running' or f[2] ~= token then return {5, f[1]} end
  if #result > 1048576 then return {1, 0, 'result is larger than 1048576 bytes'} end
  if not is_json(result) then return {1, 0, 'result is not valid JSON'} end
  release(id, f[3], f[5])
  if f[7] == '1' then tally_flush() end  -- releasing children reads workers' task sets
  finish(id, 'succeeded', now, ttl, 'result', result, f[4], f[6], f[7], f[8])  -- releases its children
  return {0}
end

if #ARGV == 5 then return ack(ARGV[1], ARGV[2], ARGV[4]) end
tally_on()  -- the tasks' counters and set members written once for all (lib/tally.lua)
local replies = {ack(ARGV[1], ARGV[2], ARGV[4])}
local all = replies[1][1] == 0
for i = 6, #ARGV, 3 do
  local r = ack(ARGV[i], ARGV[i + 1], ARGV[i + 2])
  replies[#replies + 1] = r
  all = all and r[1] == 0
end
tally_flush()
if all then return {0} end  -- every task acked
return replies
