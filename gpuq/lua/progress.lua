-- progress.lua: record how far a running task is, fenced by its lease token.
--
-- A handler's ctx.progress(fraction, message) sends this (gpuq/stream.py): the task's
-- `progress` (the fraction: as sent when it is plain decimal text, else as the number's
-- text, so readers that take decimal text only can read it) and `progress_msg` fields,
-- overwritten by each report (HMGET and HSET). They stay when the task ends or runs again,
-- until a run reports anew.
--
-- KEYS[1]  pool key base
-- ARGV[1]  task id
-- ARGV[2]  fencing token from the claim
-- ARGV[3]  fraction: a number from 0 to 1
-- ARGV[4]  message: text of at most 1024 bytes ("" for none)
-- Returns  {0}
--          {1, 0, reason} INVALID: a malformed argument (nothing written)
--          {4}        NOT_FOUND
--          {5, state} STALE_LEASE: the task is no longer running under this token

--@include args

if #ARGV ~= 4 then return {1, 0, 'expected 4 arguments'} end
local id, token, message = ARGV[1], ARGV[2], ARGV[4]
local fraction = arg_num(3, 0, 1)
if not fraction or #message > 1024 then
  return {1, 0, 'fraction must be a number from 0 to 1, the message at most 1024 bytes'}
end
-- kept as sent when it is decimal text (tonumber also takes hex and surrounding spaces)
local text = string.find(ARGV[3], '^[%d%.eE+-]+$') and ARGV[3] or tostring(fraction)
local tk = task_key(id)
local f = redis.call('HMGET', tk, 'state', 'token')
if not f[1] then return {4} end
if f[1] ~= 'running' or f[2] ~= token then return {5, f[1]} end
redis.call('HSET', tk, 'progress', text, 'progress_msg', message)
return {0}
