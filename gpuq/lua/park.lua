-- park.lua: take tasks no live GPU can hold out of their queues; put them back once one can.
--
-- A claim examines at most scan_per_queue tasks of a queue (Bounded work), so such tasks at
-- a queue's head would keep every task behind them from starting. This pass (the reaper's,
-- after its scale step has read the live workers) moves a queued task no live worker's shape
-- can hold (more VRAM than the largest live worker with at least its GPUs has, or more GPUs
-- than any has; none while no worker is live: producers may come before workers) from its
-- queue and `need` to `parked`, with its `need` score (lib/classes.lua: VRAM and GPUs), its
-- queue score kept in its `parked` field; and moves a parked task back once a live shape
-- holds it. Both are found by score ranges and judged by the task's own fields, so a call
-- reads only tasks it moves (and those within two score steps past a wide range's end). A parked
-- task stays `queued`: its tenant counts it, cancel and expiry take it from `parked`, the
-- scale signals count it (for the class that would hold it), the views count it as parked.
--
-- KEYS[1]  pool key base
-- ARGV[1]  now (ms; "0" = server clock)
-- ARGV[2]  result TTL (ms): a parked task found corrupt ends failed
-- ARGV[3]  limit: most tasks looked at to park per call, and parked tasks per held range
-- ARGV[4..]  the live workers' shapes: pairs of usable GB and GPUs
-- Returns  {0, parked, put_back, left}: left, the parked tasks that left `parked` (put back, or
--          ended another way or corrupt); those read that no live shape holds stay
--          (fewer than limit left: nothing more to put back)
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
if not live[1] then return {0, 0, 0, 0} end

-- The score ranges of `need` no live shape holds ({min, max} texts, ends included unless "("): a
-- one-GPU task above the largest shape, a task across g GPUs above the largest shape with at
-- least g, and any task across more GPUs than every shape has (gpuq/shapes.py: the same).
local function unheld(live)
  local most = 0
  for _, c in ipairs(live) do most = math.max(most, c.gpus) end
  local out = {{'(' .. score_text(largest_with(live, 1)), '(' .. score_text(2 * NEED_WIDE)}}
  for g = 2, most do
    out[#out + 1] = {'(' .. score_text(g * NEED_WIDE + largest_with(live, g)),
      '(' .. score_text((g + 1) * NEED_WIDE)}
  end
  out[#out + 1] = {score_text(math.max(2, most + 1) * NEED_WIDE), '+inf'}
  return out
end

-- The score ranges of `need` some live shape holds, the complement of unheld's, a wide one
-- two score steps past its end (a wide score keeps VRAM to 2^-52 of itself), so a task its
-- rounding put there is read, and judged by its own fields (holds).
local function held(live)
  local out = {{'-inf', score_text(largest_with(live, 1))}}
  for g = 2, 64 do
    local largest = largest_with(live, g)
    if largest <= 0 then break end
    local _, e = math.frexp(g * NEED_WIDE + largest)
    out[#out + 1] = {score_text(g * NEED_WIDE), score_text(g * NEED_WIDE + largest + 2 ^ (e - 52))}
  end
  return out
end

-- Whether a live shape holds a task of these vram_gb and gpus texts (a VRAM that is no
-- number: no).
local function holds(vram, gpus)
  local v = finite(vram)
  return v ~= nil and v <= largest_with(live, tonumber(gpus) or 1)
end

-- ids of a set with their scores over its score ranges in turn, up to `limit` in all, or
-- (each) up to `limit` in each range
local function in_ranges(key, ranges, each)
  local out = {}
  for _, r in ipairs(ranges) do
    local left = each and limit or limit - #out / 2
    if left <= 0 then break end
    local got = redis.call('ZRANGEBYSCORE', key, r[1], r[2], 'WITHSCORES', 'LIMIT', '0', ms(left))
    for i = 1, #got do out[#out + 1] = got[i] end
  end
  return out
end

local parked, heads = 0, {}
local over = in_ranges(K_NEED, unheld(live))
for i = 1, #over, 2 do
  local id = over[i]
  local f = redis.call('HMGET', task_key(id), 'state', 'priority', 'model', 'vram_gb', 'gpus')
  local p, m = level(f[2]), f[3]
  local score = f[1] == 'queued' and p and m and m ~= '' and not holds(f[4], f[5])
    and redis.call('ZSCORE', queue_key(p, m), id)
  if f[1] ~= 'queued' then
    redis.call('ZREM', K_NEED, id)  -- a stale entry (none is left by the scripts)
  elseif not (p and m and m ~= '') then
    fail_corrupt(id, p and 'model' or 'priority', p, m, now, ttl)  -- out of `need` too
  end
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

-- each range read up to limit: tasks no live shape holds at a range's end (its margin) are
-- read again each call, and must not keep the ranges after it from being read
local put_back, left = 0, 0
local back = in_ranges(K_PARKED, held(live), true)
for i = 1, #back, 2 do
  local id = back[i]
  local f = redis.call('HMGET', task_key(id), 'state', 'priority', 'model', 'vram_gb', 'gpus', 'parked')
  local p, m = level(f[2]), f[3]
  left = left + 1
  if f[1] ~= 'queued' then
    redis.call('ZREM', K_PARKED, id)  -- ended another way (cancel and expiry take their own)
  elseif not (p and m and m ~= '' and finite(f[4])) then
    redis.call('ZREM', K_PARKED, id)
    fail_corrupt(id, not p and 'priority' or finite(f[4]) and 'model' or 'vram_gb', p, m, now, ttl)
  elseif holds(f[4], f[5]) then
    unpark(id)
    index(id, p, m, ms(finite(f[6]) or now), f[4], tonumber(f[5]))
    put_back = put_back + 1
  else
    left = left - 1  -- no live shape holds it: within a wide range's margin, or scored as one GPU before
    local right = need_score(tonumber(f[4]), f[4], tonumber(f[5]) or 1)  -- `need` weighed GPUs
    if tonumber(right) ~= tonumber(back[i + 1]) then redis.call('ZADD', K_PARKED, right, id) end
  end
end
if put_back > 0 then wake_pool(put_back) end
return {0, parked, put_back, left}
