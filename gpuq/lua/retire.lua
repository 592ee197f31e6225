-- retire.lua: let an idle worker leave the pool while more than min_workers stay live (not
-- counting those draining or stopping, near the minimum).
--
-- Atomic, so two workers timing out together cannot both leave a pool at its minimum.
-- On success the worker is no longer live nor idle (claims stop finding it) and it exits
-- cleanly. Its holdings and lane go at once: it takes no task, so a claim must not wait
-- for it as a busy holder (lib/wake.lua). Its hash and lists are removed by its own leave;
-- should it die first, the reaper, which looks only at live workers, never would, so
-- they expire a day after. Its duty as its shape's lookout, if it had it, passes to
-- another idle worker of its shape (lib/lookout.lua).
--
-- KEYS[1]  pool key base
-- ARGV[1]  worker id
-- ARGV[2]  now (ms; "0" = server clock)
-- ARGV[3]  min_workers, unless the pool's settings hash (set by the reaper) says otherwise
-- Returns  {0, 1, live}   retired (live: live workers before it left)
--          {0, 0, live}   stays: at the minimum, or it runs tasks
--          {1, 0, reason} INVALID: a malformed argument (nothing written)

--@include args
--@include lanes
--@include lookout
--@include depart

if #ARGV ~= 3 then return {1, 0, 'expected 3 arguments'} end
local worker, now, min = ARGV[1], clock(ARGV[2]), arg_num(3, 0, 1e9, true)
if worker == '' or not now or not min then
  return {1, 0, 'worker id must not be empty, now ms >= 0 and min_workers an integer >= 0'}
end
min = finite(redis.call('HGET', K_SETTINGS, 'min_workers')) or min
local live = redis.call('ZCOUNT', K_WORKERS, now, '+inf')
-- near the minimum, live workers on their way out (draining, stopping) do not count: they
-- would leave the pool below it (far from it, their states are not read)
local staying = live
if live > min and live - min <= 64 then
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', K_WORKERS, now, '+inf')) do
    local state = redis.call('HGET', worker_key(w), 'state')
    if w ~= worker and (state == 'draining' or state == 'retiring') then staying = staying - 1 end
  end
end
if staying <= min or redis.call('SCARD', worker_tasks_key(worker)) > 0 then
  return {0, 0, live}
end
local claimable = tonumber(redis.call('ZSCORE', K_IDLE, worker))
local wk = worker_key(worker)
local w = redis.call('HMGET', wk, 'models', 'gpus')
local lanes = redis.call('HGET', K_LANES, worker)
depart(worker, w[1])
redis.call('HSET', wk, 'state', 'retiring')
if claimable then pass_lookout(worker, claimable, lane_levels(lanes), tonumber(w[2]) or 1, now) end
for _, k in ipairs({wk, wake_key(worker), control_key(worker), reservation_key(worker)}) do
  redis.call('PEXPIRE', k, 86400000)
end
return {0, 1, live}
