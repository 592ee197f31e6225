-- follow.lua: a reader starts following a task's stream; the task's state.
--
-- A task that has not ended is marked `streamed`, so that whatever ends it
-- (lib/finish.lua) appends the end marker: a reader then blocks on XREAD until it, and
-- never polls the hash, even for a task that emits nothing. A task that has ended is left
-- as it is: its stream, if it has one, already ends with the marker (gpuq/stream.py).
--
-- KEYS[1]  pool key base
-- ARGV[1]  task id
-- Returns  {0, state}
--          {4}        NOT_FOUND

local tk = task_key(ARGV[1] or '')
local f = redis.call('HMGET', tk, 'state', 'streamed')
if not f[1] then return {4} end
local s = f[1]
if f[2] ~= '1' and s ~= 'succeeded' and s ~= 'failed' and s ~= 'expired' and s ~= 'canceled' then
  redis.call('HSET', tk, 'streamed', '1')
end
return {0, s}
