-- heartbeat.lua: renew a worker's liveness and the leases of the tasks it runs.
--
-- A lease is renewed only while the task is still running under the caller's token;
-- otherwise it is reported lost (reclaimed after expiry, canceled), and the worker must
-- stop working on it: its ack would be rejected anyway.
--
-- KEYS[1]  pool key base
-- ARGV[1]  worker id
-- ARGV[2]  now (ms; "0" = server clock)
-- ARGV[3]  lease (ms): new expiry of each renewed lease and of the worker's liveness
-- ARGV[4..]  pairs: task id, fencing token
-- Returns  {0, revived, lost_id, ...}: revived is 1 when the worker was not registered as
--          live (the reaper took it for dead), so it must restore its model holdings
--          {1, 0, reason} INVALID: a malformed argument (nothing written)

--@include args

if #ARGV < 3 or #ARGV % 2 == 0 then return {1, 0, 'expected 3 arguments, then task id, token pairs'} end
local worker, now, lease = ARGV[1], clock(ARGV[2]), arg_num(3, 0, 1e12, true)
if worker == '' or not now or not lease then
  return {1, 0, 'worker id must not be empty, now and lease must be ms >= 0'}
end
-- a retired worker is on its way out: a late beat must not list it as live again, or
-- another idle worker could count it and retire below min_workers
if redis.call('HGET', worker_key(worker), 'state') == 'retiring' then return {0, 0} end
local revived = redis.call('ZADD', K_WORKERS, now + lease, worker)
redis.call('HSET', worker_key(worker), 'seen_at', ms(now))
local out = {0, revived}
for i = 4, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local f = redis.call('HMGET', task_key(id), 'state', 'token')
  if f[1] == 'running' and f[2] == token then
    redis.call('ZADD', K_RUNNING, 'XX', now + lease, id)
    redis.call('ZREM', K_HANDED, id)  -- a task handed over at enqueue: taken up
  else
    out[#out + 1] = id
  end
end
return out
