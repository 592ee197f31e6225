-- emit.lua: append one chunk to a running task's stream, fenced by its lease token.
--
-- A handler's ctx.emit(value) sends this (gpuq/stream.py). The chunk becomes an entry of
-- `stream:<id>`: {attempt, token, seq, data}, attempt as the task's hash holds it, token
-- the run's fencing token (a new, larger one for every start of the task), seq the run's
-- own count of its chunks from 0. The stream keeps about maxlen entries (XADD MAXLEN ~:
-- the oldest go, in whole nodes) and has no TTL while the task runs. The first chunk marks
-- the task `streamed`, so that whatever ends it (lib/finish.lua) appends the end marker
-- and gives the stream the task's TTL. One chunk costs HMGET and XADD (HSET once).
--
-- KEYS[1]  pool key base
-- ARGV[1]  task id
-- ARGV[2]  fencing token from the claim
-- ARGV[3]  seq: integer >= 0, the chunk's number within this run
-- ARGV[4]  data (JSON text)
-- ARGV[5]  maxlen: entries the stream keeps (integer >= 1)
-- ARGV[6]  largest data accepted (bytes, 1..1048576)
-- Returns  {0, entry id}
--          {1, 0, reason} INVALID: a malformed argument, or data larger than the limit or
--                     not JSON text (nothing written; the task keeps running)
--          {4}        NOT_FOUND
--          {5, state} STALE_LEASE: the task is no longer running under this token

--@include args
--@include json

if #ARGV ~= 6 then return {1, 0, 'expected 6 arguments'} end
local id, token, data = ARGV[1], ARGV[2], ARGV[4]
local seq, maxlen, most = arg_num(3, 0, 1e15, true), arg_num(5, 1, 1e9, true),
  arg_num(6, 1, 1048576, true)
if not (seq and maxlen and most) then
  return {1, 0, 'seq must be an integer >= 0, maxlen >= 1 and the size limit 1..1048576'}
end
local tk = task_key(id)
local f = redis.call('HMGET', tk, 'state', 'token', 'attempt', 'streamed')
if not f[1] then return {4} end
if f[1] ~= 'running' or f[2] ~= token then return {5, f[1]} end
if #data > most then return {1, 0, 'chunk is larger than ' .. ms(most) .. ' bytes'} end
if not is_json(data) then return {1, 0, 'chunk is not valid JSON'} end
local entry = redis.call('XADD', stream_key(id), 'MAXLEN', '~', ms(maxlen), '*',
  'attempt', f[3] or '0', 'token', token, 'seq', ms(seq), 'data', data)
if f[4] ~= '1' then redis.call('HSET', tk, 'streamed', '1') end
return {0, entry}
