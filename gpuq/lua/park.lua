-- park.lua: take tasks no GPU class can hold out of their queues; put them back once one can.
--
-- A claim examines at most scan_per_queue tasks of a queue (Bounded work), so such tasks at
-- a queue's head would keep every task behind them from starting. This pass (the reaper's)
-- moves a queued task whose VRAM need is above every registered class's (none while no class
-- is known: producers may come before workers) from its queue and `need` to `parked`, scored
-- by its need, its queue score kept in its `parked` field; and moves a parked task back once
-- a class holds it (its VRAM and GPUs, as enqueue's check_fit judges). A parked task stays
-- `queued`: its tenant counts it, cancel and expiry take it from `parked`, the views and the
-- scale signals count it as unschedulable.
--
-- KEYS[1]  pool key base
-- ARGV[1]  now (ms; "0" = server clock)
-- ARGV[2]  result TTL (ms): a parked task found corrupt ends failed
-- ARGV[3]  limit: most tasks looked at each way
-- Returns  {0, parked, unparked}
--          {1, 0, reason} INVALID: a malformed argument (nothing written)

--@include args
--@include queue
--@include classes
--@include corrupt
--@include wake

if #ARGV ~= 3 then return {1, 0, 'expected 3 arguments'} end
local now, ttl, limit = clock(ARGV[1]), ttl_arg(2), arg_num(3, 1, 1e4, true)
if not (now and ttl and limit) then return {1, 0, 'now and ttl must be ms >= 0, limit 1..1e4'} end
local classes = read_classes()
if not classes[1] then return {0, 0, 0} end
local largest = largest_with(classes, 1)

local parked, heads = 0, {}
local over = redis.call('ZRANGEBYSCORE', K_NEED, '(' .. largest, '+inf', 'WITHSCORES', 'LIMIT', '0', ms(limit))
for i = 1, #over, 2 do
  local id = over[i]
  local f = redis.call('HMGET', task_key(id), 'state', 'priority', 'model')
  local p, m = level(f[2]), f[3]
  local score = f[1] == 'queued' and p and m and redis.call('ZSCORE', queue_key(p, m), id)
  if score then
    redis.call('ZREM', queue_key(p, m), id)
    redis.call('ZREM', K_NEED, id)
    redis.call('ZADD', K_PARKED, over[i + 1], id)
    redis.call('HSET', task_key(id), 'parked', score)
    heads[p .. ':' .. m] = {p, m}
    parked = parked + 1
  end
end
for _, h in pairs(heads) do refresh_head(h[1], h[2]) end

local unparked = 0
local held = redis.call('ZRANGEBYSCORE', K_PARKED, '-inf', largest, 'WITHSCORES', 'LIMIT', '0', ms(limit))
for i = 1, #held, 2 do
  local id, need = held[i], held[i + 1]
  local f = redis.call('HMGET', task_key(id), 'state', 'priority', 'model', 'gpus', 'parked')
  local p, m = level(f[2]), f[3]
  if f[1] ~= 'queued' then
    redis.call('ZREM', K_PARKED, id)  -- ended another way (cancel and expiry take their own)
  elseif not (p and m and m ~= '') then
    redis.call('ZREM', K_PARKED, id)
    fail_corrupt(id, p and 'model' or 'priority', p, m, now, ttl)
  elseif tonumber(need) <= largest_with(classes, tonumber(f[4]) or 1) then
    local score = finite(f[5]) or now
    redis.call('ZREM', K_PARKED, id)
    redis.call('HDEL', task_key(id), 'parked')
    index(id, p, m, ms(score), need)
    unparked = unparked + 1
  end
end
if unparked > 0 then wake_pool(unparked) end
return {0, parked, unparked}
