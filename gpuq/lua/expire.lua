-- expire.lua: end queued tasks whose deadline has passed or can no longer be met (bounded).
--
-- A queued task with a deadline expires when now + its estimate (+ the model's measured mean
-- load time when no live worker holds the model) is past its deadline. It ends "expired"
-- with the reason in its error field, its waiters wake, and the pool counts it per priority
-- (stats "expired:P<n>"; and "sla_missed:P<n>" where it never started: lib/start.lua). Only
-- tasks whose latest start (deadline - estimate) is within `horizon` of now are looked at,
-- earliest first, so a call costs O(limit x log N).
--
-- KEYS[1]  pool key base
-- ARGV[1]  now (ms; "0" = server clock)
-- ARGV[2]  limit: most tasks looked at per call
-- ARGV[3]  result TTL (ms)
-- ARGV[4]  horizon (ms): the longest model load time worth looking ahead for
-- ARGV[5]  offset: tasks at the front of the window to skip (kept by earlier calls of
--          this pass: they can still start in time)
-- Returns  {0, expired, looked_at, kept}: kept, those looked at that stay in the window (the
--          next call's offset grows by them; the others left it: expired, ended, corrupt).
--          A queued task whose hash is corrupt is failed, with the field in its error, and
--          not counted as expired
--          {1, 0, reason} INVALID: a malformed argument (nothing written)

--@include args
--@include queue
--@include corrupt
--@include reserve
--@include start
--@include finish
--@include tenancy

if #ARGV < 4 or #ARGV > 5 then return {1, 0, 'expected 5 arguments'} end
local now, limit, ttl = clock(ARGV[1]), arg_num(2, 1, 1e6, true), ttl_arg(3)
local horizon, offset = arg_num(4, 0, 1e13, true), arg_num(5, 0, 1e9, true) or not ARGV[5] and 0
if not (now and limit and ttl and horizon and offset) then
  return {1, 0, 'now, ttl and horizon must be ms >= 0, limit 1..1e6, offset >= 0'}
end
local expired, kept = 0, 0
local ids = redis.call('ZRANGEBYSCORE', K_DEADLINES, '-inf', now + horizon, 'LIMIT', offset, limit)

-- mean measured load time of a model no live worker holds (0 when one holds it)
local function cold_load_ms(m)
  for _, w in ipairs(redis.call('SMEMBERS', holders_key(m))) do
    local alive = redis.call('ZSCORE', K_WORKERS, w)
    if alive and tonumber(alive) >= now then return 0 end
  end
  return mean_load_ms(m)
end

for _, id in ipairs(ids) do
  local f = redis.call('HMGET', task_key(id), 'state', 'deadline', 'est_s', 'priority', 'model',
    'reserved_for', 'yield_victim', 'fair', 'parked')
  local bad = f[1] == 'queued' and f[2] and f[2] ~= ''
    and defect(f[4], f[5], 1, f[3], 0, f[2])  -- the fields read here (vram and score: claim's)
  if f[1] ~= 'queued' or not f[2] or f[2] == '' then
    redis.call('ZREM', K_DEADLINES, id)  -- claimed or ended since: nothing to watch
  elseif bad then
    if f[9] then unpark(id) end
    fail_corrupt(id, bad, f[4], f[5], now, ttl)
  else
    local deadline, run = tonumber(f[2]), math.floor(tonumber(f[3]) * 1000)
    local reason
    if now >= deadline then
      reason = 'deadline passed while queued'
    elseif now + run > deadline then
      reason = string.format('deadline cannot be met: %.3f s left, task needs %.3f s',
        (deadline - now) / 1000, run / 1000)
    else
      local load = cold_load_ms(f[5])
      if now + run + load > deadline then
        reason = string.format('deadline cannot be met: %.3f s left, task needs %.3f s '
          .. 'plus %.3f s to load model %s (no live worker holds it)',
          (deadline - now) / 1000, run / 1000, load / 1000, f[5])
      end
    end
    if reason then
      unqueue(id, f[4], f[5])
      if f[9] then unpark(id) end  -- out of its queue (park.lua)
      fair_leave(id, f[8])
      withdraw_yield(id, f[6], f[7], now)
      finish(id, 'expired', now, ttl, 'error', reason)  -- counts expired:P<n>
      local at = redis.call('HMGET', task_key(id), 'due_at', 'enqueued_at', 'began_at', 'tenant')
      note_miss(id, f[4], f[5], now - (finite(at[1]) or finite(at[2]) or now), now, 'expired', at[3], at[4])
      expired = expired + 1
    else
      kept = kept + 1
    end
  end
end
return {0, expired, #ids, kept}
