-- requeue.lua: return a running task to its queue (worker shutdown, yield, operator).
--
-- With a token the call is fenced like an ack; with token "" it is an operator's requeue:
-- of whatever runs now, of a retry waiting out its backoff, or of a task that ended
-- failed, expired or canceled (fresh attempts, no deadline, its stream and progress
-- gone). The attempt is given back unless consume is "1". A preempted task (kind
-- "yielded": it gave way when asked; "stopped": the worker stopped it past its yield
-- deadline) counts one more preemption, in its hash and in the pool's stats
-- ("preempt:<kind>" and "preempt:<kind>:P<n>"), and keeps the checkpoint its handler saved
-- for its next run.
--
-- KEYS[1]  pool key base
-- ARGV[1]  task id
-- ARGV[2]  fencing token, or "" (operator)
-- ARGV[3]  now (ms; "0" = server clock)
-- ARGV[4]  reason (kept in the task's error field)
-- ARGV[5]  consume: "1" counts the attempt
-- ARGV[6]  result TTL (ms), used if a consumed attempt was the last
-- ARGV[7]  preemption kind: "" (none), "yielded" or "stopped"
-- ARGV[8]  checkpoint (JSON text; "" keeps the one stored)
-- Returns  {0, "queued" | "failed" | "expired"} ("expired": its deadline can no longer be met,
--          lib/push.lua expire_due; "failed" also for a task whose hash is corrupt: it
--          ends failed with the field in its error)
--          {0, "kept"}: a stop (kind "stopped") of a task no longer asked to yield (the
--                       request was withdrawn before the worker read "unyield"): it runs on
--          {1, 0, reason} INVALID: a malformed argument, the checkpoint is not JSON text,
--                         or (operator) the task is queued or succeeded
--          {4} NOT_FOUND | {5, state} STALE_LEASE

--@include args
--@include json
--@include push
--@include reserve

-- Task id, ended and now run again (an operator's requeue): a child still waiting counted
-- its end (settle_children), so it waits for its next end once more; its children set,
-- which the end gave a TTL, is kept for as long as it waits.
local function recount_children(id)
  local ck = children_key(id)
  redis.call('PERSIST', ck)
  for _, c in ipairs(redis.call('SMEMBERS', ck)) do
    if redis.call('HGET', task_key(c), 'state') == 'waiting' then
      redis.call('HINCRBY', task_key(c), 'pending', 1)
    end
  end
end

-- An expired task asked for again, that never started: the SLA miss its expiry counted
-- (lib/start.lua note_miss) is taken back, as its next start decides it (with the score it
-- kept: once, not twice).
local function unmiss(tk)
  local f = redis.call('HMGET', tk, 'began_at', 'priority', 'tenant')
  if (f[1] and f[1] ~= '') or not level(f[2]) then return end
  local field = 'sla_missed:P' .. level(f[2])
  for _, name in ipairs({field, f[3] and f[3] ~= '' and field .. ':' .. f[3] or nil}) do
    if (tonumber(redis.call('HGET', K_STATS, name)) or 0) > 0 then
      redis.call('HINCRBY', K_STATS, name, -1)
    end
  end
end

if #ARGV < 6 or #ARGV > 8 then return {1, 0, 'expected 8 arguments'} end
local id, token, now, ttl = ARGV[1], ARGV[2], clock(ARGV[3]), ttl_arg(6)
local kind, checkpoint = ARGV[7] or '', ARGV[8] or ''
if not (now and ttl) then return {1, 0, 'now and ttl must be ms >= 0'} end
if kind ~= '' and kind ~= 'yielded' and kind ~= 'stopped' then
  return {1, 0, 'preemption kind must be "", "yielded" or "stopped"'}
end
local tk = task_key(id)
local f = redis.call('HMGET', tk, 'state', 'token', 'yield_by', 'worker')
if not f[1] then return {4} end
if token == '' and f[1] ~= 'running' then
  -- an operator's requeue of a task that is not running: a retry waiting out its backoff
  -- goes now; an ended task other than succeeded runs again with fresh attempts and
  -- without its deadline (asking for it again overrides it)
  if f[1] == 'delayed' then
    redis.call('ZREM', K_DELAYED, id)
  elseif f[1] == 'failed' or f[1] == 'expired' or f[1] == 'canceled' then
    if f[1] == 'expired' then unmiss(tk) end
    redis.call('PERSIST', tk)
    redis.call('DEL', done_key(id), stream_key(id))  -- its stream starts afresh
    redis.call('HSET', tk, 'attempt', '0', 'deadline', '', 'finished_at', '', 'worker', '',
      'token', '', 'streamed', '', 'progress', '', 'progress_msg', '', 'yield_by', '',
      'yield_for', '', 'loading', '')
    -- a child canceled while it waited for its parents never got a start-by score: it gets
    -- the one its release would have given (its parents are not waited for again)
    local s = redis.call('HMGET', tk, 'score', 'sla_ms')
    if not finite(s[1]) then redis.call('HSET', tk, 'score', ms(now + (finite(s[2]) or 0))) end
    recount_children(id)
  else
    local said = f[1] == 'succeeded' and 'task already succeeded' or 'task is ' .. f[1]
    return {1, 0, said .. ': there is nothing to requeue'}
  end
  -- a task not yet due (delay_s / at; delayed, or canceled while delayed) is due now: its
  -- start-by score, fair order and deadline, all counted from its due time, move back by as
  -- much, else it would sort behind every task of its queue enqueued before that time
  local d = redis.call('HMGET', tk, 'due_at', 'score', 'order', 'deadline')
  local due = finite(d[1])
  if due and due > now then
    local shift, moved = due - now, {'due_at', ms(now)}
    for i, field in ipairs({'score', 'order', 'deadline'}) do
      local v = finite(d[i + 1])
      if v then moved[#moved + 1] = field; moved[#moved + 1] = ms(v - shift) end
    end
    redis.call('HSET', tk, unpack(moved))
  end
  redis.call('HSET', tk, 'state', 'queued', 'queued_at', ms(now), 'error', ARGV[4])
  return {0, push(id, now, ttl)}
end
if f[1] ~= 'running' or (token ~= '' and f[2] ~= token) then return {5, f[1]} end
-- an operator takes a running task back: its worker is told at once (lib/reserve.lua)
if token == '' and f[4] and f[4] ~= '' then tell_lost(f[4], id, f[2]) end
-- the waiting task started or ended between the stop's deadline and the worker's reading
-- of "unyield": stopping would throw away work nobody waits for
if kind == 'stopped' and (f[3] or '') == '' then return {0, 'kept'} end
if checkpoint ~= '' then
  if #checkpoint > 1048576 or not is_json(checkpoint) then
    return {1, 0, 'checkpoint is not valid JSON of at most 1048576 bytes'}
  end
  redis.call('HSET', tk, 'checkpoint', checkpoint)
end
if kind ~= '' then
  redis.call('HINCRBY', tk, 'preemptions', 1)
  redis.call('HINCRBY', K_STATS, 'preempt:' .. kind, 1)
  local p = level(redis.call('HGET', tk, 'priority'))
  if p then redis.call('HINCRBY', K_STATS, 'preempt:' .. kind .. ':P' .. p, 1) end
end
return {0, requeue(id, now, ARGV[4], ARGV[5] == '1', ttl)}
