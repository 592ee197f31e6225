-- park.lua: take tasks no live GPU can hold out of their queues; put them back once one can.
--
-- A claim examines at most scan_per_queue tasks of a queue (Bounded work), so such tasks at
-- a queue's head would keep every task behind them from starting. This pass (the reaper's,
-- after its scale step has read the live workers) moves a queued task whose VRAM need is
-- above every live worker's usable VRAM (none while no worker is live: producers may come
-- before workers) from its queue and `need` to `parked`, scored by its need, its queue score
-- kept in its `parked` field; and moves a parked task back once a live worker can hold it
-- (its VRAM and GPUs, as enqueue's check_fit judges against the classes). A parked task stays
-- `queued`: its tenant counts it, cancel and expiry take it from `parked`, the scale signals
-- count its need (for the class that would hold it), the views count it as parked.
--
-- KEYS[1]  pool key base
-- ARGV[1]  now (ms; "0" = server clock)
-- ARGV[2]  result TTL (ms): a parked task found corrupt ends failed
-- ARGV[3]  limit: most tasks parked, and most parked tasks looked at, per call
-- ARGV[4..]  the live workers' shapes: pairs of usable GB and GPUs
-- Returns  {0, parked, put_back, looked_at, kept}: looked_at, the parked tasks looked at;
--          kept, those left parked. The parked tasks within the live workers' VRAM are looked
--          at in turn: `parked:from` holds how many to skip (those kept by earlier calls,
--          whichever reaper made them), back to 0 once a call looks at fewer than limit.
--          {1, 0, reason} INVALID: a malformed argument (nothing written)

--@include args
--@include queue
--@include classes
--@include corrupt
--@include wake

local now, ttl, limit = clock(ARGV[1]), ttl_arg(2), arg_num(3, 1, 1e4, true)
if not (now and ttl and limit) or #ARGV % 2 ~= 1 then
  return {1, 0, 'now and ttl must be ms >= 0, limit 1..1e4, then pairs of GB and GPUs'}
end
local live = {}
for i = 4, #ARGV, 2 do
  local gb, gpus = arg_num(i, 0, 1e9), arg_num(i + 1, 1, 64, true)
  if not (gb and gpus) then return {1, 0, 'a live shape must be GB 0..1e9 and GPUs 1..64'} end
  live[#live + 1] = {gb = gb, gpus = gpus}
end
if not live[1] then return {0, 0, 0, 0, 0} end
local largest = largest_with(live, 1)

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

local put_back, kept = 0, 0
local offset = math.max(0, math.floor(tonumber(redis.call('GET', K_PARKED_FROM)) or 0))
local held = redis.call('ZRANGEBYSCORE', K_PARKED, '-inf', largest, 'WITHSCORES', 'LIMIT', ms(offset), ms(limit))
for i = 1, #held, 2 do
  local id, need = held[i], held[i + 1]
  local f = redis.call('HMGET', task_key(id), 'state', 'priority', 'model', 'gpus', 'parked')
  local p, m = level(f[2]), f[3]
  if f[1] ~= 'queued' then
    redis.call('ZREM', K_PARKED, id)  -- ended another way (cancel and expiry take their own)
  elseif not (p and m and m ~= '') then
    redis.call('ZREM', K_PARKED, id)
    fail_corrupt(id, p and 'model' or 'priority', p, m, now, ttl)
  elseif tonumber(need) <= largest_with(live, tonumber(f[4]) or 1) then
    unpark(id)
    index(id, p, m, ms(finite(f[5]) or now), need)
    put_back = put_back + 1
  else
    kept = kept + 1  -- more GPUs than any live group has
  end
end
if put_back > 0 then wake_pool(put_back) end
if #held / 2 == limit then
  redis.call('SET', K_PARKED_FROM, ms(offset + kept))
elseif offset > 0 then
  redis.call('DEL', K_PARKED_FROM)
end
return {0, parked, put_back, #held / 2, kept}
