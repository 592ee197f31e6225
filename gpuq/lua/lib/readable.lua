-- lib/readable.lua: a queued task's fields as a claim reply gives them to a worker.

--@include args
--@include json
--@include corrupt

-- What a claim reads of a queued task in one HMGET: the fields readable checks and the
-- claim reply gives, in readable's order (the first N_READABLE), then offered, state and gpus
-- (at N_READABLE + 1, + 2, + 3), which the claim checks before it passes the reply in, and
-- error (+ 4: false when a hash read whole has none: lib/take.lua then clears none).
-- Constants: made once where the scripts run as a function library (gpuq/functions.py).
local N_READABLE = 20
local READ_HELD = {'handler', 'payload', 'model', 'vram_gb', 'priority', 'est_s', 'attempt',
  'deadline', 'tenant', 'checkpoint', 'enqueued_at', 'queued_at', 'score', 'reserved_for',
  'yield_victim', 'max_attempts', 'began_at', 'fair', 'order', 'due_at', 'offered', 'state',
  'gpus', 'error'}

-- Whether a number's text is hex, which tonumber reads and a worker's float() does not.
local function hex(v) return string.find(v, '[xX]') ~= nil end

-- An epoch ms field as an integer (0..1e15), or nil: its reply text is that integer.
local function epoch(v)
  local n = finite(v)
  if n and n >= 0 and n <= 1e15 and n % 1 == 0 then return n end
  return nil
end

-- The fields of task id of queue (p, m) that a claim reply and later scripts rely on, the
-- attempt and times in the reply's form; or nil when one is missing or malformed: the task
-- is then failed (at now, its result kept ttl ms) with that field in its error, so a corrupt
-- hash reaches no worker. f: the first N_READABLE fields of READ_HELD, read by the caller
-- (nil: read here); vram, est, queued: the numbers of f[4], f[6] and f[12] where the caller
-- read them already (nil: read here). Each number is read from its text once (a tonumber of
-- a 13-digit text is two strtod calls): f.vram, f.score and f.enqueued keep vram_gb, score
-- and enqueued_at as numbers for the claim that goes on with them.
local function readable(id, p, m, now, ttl, f, vram, est, queued)
  f = f or redis.call('HMGET', task_key(id), unpack(READ_HELD, 1, N_READABLE))
  local attempt, tries = (not f[7] or f[7] == '') and 0 or finite(f[7]), finite(f[16])
  local has_deadline = f[8] and f[8] ~= ''
  vram, est = vram or finite(f[4]), est or finite(f[6])
  local score, deadline = finite(f[13]), has_deadline and epoch(f[8])
  local enqueued
  if queued then  -- f[12] as the caller read it, checked as epoch checks its text
    if not (queued >= 0 and queued <= 1e15 and queued % 1 == 0) then queued = nil end
    enqueued = f[11] == f[12] and queued or epoch(f[11])  -- the same text: read once
  else
    enqueued = epoch(f[11])
    queued = f[12] == f[11] and enqueued or epoch(f[12])
  end
  -- defect's checks (lib/corrupt.lua), in its order, on the numbers read here; a text of at
  -- most 2 bytes holds no hex number ("0x1")
  local bad = f[5] ~= (LEVEL_TEXT[p] or tostring(p)) and 'priority' or f[3] ~= m and 'model'
    or not level(f[5]) and 'priority' or (not m or m == '') and 'model'
    or not (vram and vram > 0) and 'vram_gb' or not (est and est >= 0 and est <= 1e10) and 'est_s'
    or not score and 'score' or has_deadline and not deadline and not finite(f[8]) and 'deadline'
    or #f[4] > 2 and hex(f[4]) and 'vram_gb' or #f[6] > 2 and hex(f[6]) and 'est_s'  -- passed on as stored
  if bad then
  elseif not f[1] or f[1] == '' then bad = 'handler'
  elseif not f[2] then bad = 'payload'
  elseif not f[9] then bad = 'tenant'
  elseif not (attempt and attempt >= 0 and attempt < 1e6 and attempt % 1 == 0) then
    bad = 'attempt'
  elseif not (tries and tries >= 1 and tries % 1 == 0) then bad = 'max_attempts'
  elseif has_deadline and not deadline then bad = 'deadline'
  elseif not enqueued then bad = 'enqueued_at'
  elseif not queued then bad = 'queued_at'
  elseif f[10] and f[10] ~= '' and not is_json(f[10]) then bad = 'checkpoint'
  end
  if bad then
    fail_corrupt(id, bad, tostring(p), m, now, ttl)
    return nil
  end
  f[7], f[11] = ms(attempt + 1), ms(enqueued)
  f[12] = queued == enqueued and f[11] or ms(queued)
  f[8] = has_deadline and ms(deadline) or ''
  -- when it was due (a delayed or released task): its SLA counts from then; not a time: enqueue's
  f.vram, f.score, f.enqueued, f.due = vram, score, enqueued, epoch(f[20])
  return f
end
