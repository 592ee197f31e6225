-- fail.lua: record a failed attempt, fenced by its lease token. Retries wait out an
-- exponential backoff in the delayed set (state "delayed"); the last attempt ends "failed".
--
-- KEYS[1]  pool key base
-- ARGV[1]  task id
-- ARGV[2]  fencing token
-- ARGV[3]  now (ms; "0" = server clock)
-- ARGV[4]  error (one line)
-- ARGV[5]  retry: "1" if the error may succeed on retry, "0" to fail for good now, "2" to
--          pass it on: another worker runs its handler (gpuq/worker/passing.py); its attempt
--          is given back and it waits `base` ms
-- ARGV[6]  backoff base (ms): the wait after attempt a is base * 2^(a-1)
-- ARGV[7]  backoff cap (ms)
-- ARGV[8]  result TTL (ms)
-- Returns  {0, "delayed" | "passed", wait_ms} | {0, "failed"} (also when the task's attempt counts
--          are corrupt: it is not retried)
--          {1, 0, reason} INVALID: a malformed argument (nothing written)
--          {4} NOT_FOUND | {5, state} STALE_LEASE

--@include args
--@include finish
--@include failures
--@include gates

if #ARGV ~= 8 then return {1, 0, 'expected 8 arguments'} end
local id, token, now, err = ARGV[1], ARGV[2], clock(ARGV[3]), ARGV[4]
local base, cap, ttl = arg_num(6, 0, 1e12, true), arg_num(7, 0, 1e12, true), ttl_arg(8)
if not (now and base and cap and ttl) then
  return {1, 0, 'now, backoff base and cap and ttl must be ms >= 0'}
end
local tk = task_key(id)
local f = redis.call('HMGET', tk, 'state', 'token', 'worker', 'attempt', 'max_attempts', 'charged')
if not f[1] then return {4} end
if f[1] ~= 'running' or f[2] ~= token then return {5, f[1]} end
release(id, f[3], f[6])
local attempt, max_attempts = finite(f[4]), finite(f[5])
local pass = ARGV[5] == '2' and attempt and attempt >= 1
if pass then redis.call('HSET', tk, 'attempt', ms(attempt - 1)) end
if pass or (ARGV[5] == '1' and attempt and max_attempts and attempt < max_attempts) then
  local wait = pass and base or math.floor(math.min(base * 2 ^ math.max(0, attempt - 1), cap))
  -- a yield asked of this run is moot: its retry may be asked again (preempt.lua refuses a
  -- victim whose yield_by is set); its progress is the failed run's (a retry starts over,
  -- as its stream does)
  redis.call('HSET', tk, 'state', 'delayed', 'error', err, 'worker', '', 'token', '',
    'ready_at', '', 'loading', '', 'yield_by', '', 'yield_for', '', 'progress', '', 'progress_msg', '')
  add_delayed(now + wait, id)
  return {0, pass and 'passed' or 'delayed', ms(wait)}
end
end_failed(id, now, ttl, err)
return {0, 'failed'}
