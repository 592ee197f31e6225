-- wait.lua: a waiter registers for a task's end, just before it blocks on its done list.
--
-- Only a task someone waits on gets its done list pushed when it ends (lib/finish.lua): the
-- others pay no push and leave no key. A task that has not ended is marked `waited`, so
-- whatever ends it pushes. One that has ended gets its done list now if it has none (an
-- end before any waiter came), expiring with the task's hash, so a BLMOVE sent after this
-- call returns at once. Waiters send it with every pop, in the same round trip (§7 of
-- docs/PROTOCOL.md): it also covers an operator requeue, which deletes the done list.
--
-- KEYS[1]  pool key base
-- ARGV[1]  task id
-- Returns  {0, state}
--          {4}        NOT_FOUND

local id = ARGV[1] or ''
local tk = task_key(id)
local f = redis.call('HMGET', tk, 'state', 'waited')
local s = f[1]
if not s then return {4} end
if s == 'succeeded' or s == 'failed' or s == 'expired' or s == 'canceled' then
  local done = done_key(id)
  if redis.call('EXISTS', done) == 0 then
    redis.call('LPUSH', done, s)
    local left = redis.call('PTTL', tk)
    if left > 0 then redis.call('PEXPIRE', done, left) end
  end
elseif f[2] ~= '1' then  -- a waiter's every pop registers: write the mark once
  redis.call('HSET', tk, 'waited', '1')
end
return {0, s}
