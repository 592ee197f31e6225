-- lib/queue.lua: a queued task in its (priority, model) queue and the pool's indexes.

--@include args
--@include tally
--@include classes

-- The work index (`models`): every (level, model) with queued work in one sorted set, member
-- "<p>:<model>", score p x LEVEL_SPAN + its queue's head score, so the levels lie in order and
-- one read of its first page says which levels have work (gpuq/work_index.py reads it too).
-- Numbers are passed to redis.call as text made here: a Lua number would be formatted by the
-- server (%.17g), which costs more than the rest of an index write.
local LEVEL_SPAN = 1e15
local LEVEL_TEXT = {[0] = '0', '1', '2', '3'}
local LEVEL_OF = {['0'] = 0, ['1'] = 1, ['2'] = 2, ['3'] = 3}
-- each level's score range, [low, high)
local LEVEL_LOW = {[0] = '-500000000000000', '500000000000000', '1500000000000000', '2500000000000000'}
local LEVEL_HIGH = {[0] = '(500000000000000', '(1500000000000000', '(2500000000000000', '(3500000000000000'}

-- '0' x k for k = 0..15: the zeros a spliced score needs, by lookup, not string.rep
local ZEROS = (function()
  local t, z = {}, ''
  for k = 0, 15 do t[k], z = z, z .. '0' end
  return t
end)()

local function work_member(p, m) return (LEVEL_TEXT[p] or p) .. ':' .. m end

-- p x LEVEL_SPAN + score as text: spliced where score is a whole number of at most 15 digits
-- (a head score in ms), else computed. text: score's text made by ms, when the caller has
-- it (score is then a number: no type or digit test of a text it made).
local function work_score(p, score, text)
  local kind = text and 'number' or type(score)
  if kind == 'number' and score % 1 == 0 and score >= 0 and score < 1e15 then
    text = text or ms(score)
  elseif kind ~= 'string' or #score > 15 or not string.find(score, '^%d+$') then
    return string.format('%.17g', tonumber(p) * LEVEL_SPAN + tonumber(score))
  else
    text = score
  end
  if p == 0 or p == '0' then return text end
  return (LEVEL_TEXT[p] or p) .. ZEROS[15 - #text] .. text
end

-- The models of level p among index members (others skipped).
local function work_models(members, p)
  local out, prefix = {}, (LEVEL_TEXT[p] or p) .. ':'
  for _, v in ipairs(members) do
    if string.sub(v, 1, 2) == prefix then out[#out + 1] = string.sub(v, 3) end
  end
  return out
end

-- What the index's first n members (first) say of each level: true or false where they show
-- it in full (a level before the last one they reach, or every level when they are fewer
-- than n), nil where they cannot tell; then true for each level they show some work of.
-- One pass over them (not a list of models made per level to test its first).
local function work_levels(first, n)
  local last, seen, known = first[1] and LEVEL_OF[string.sub(first[#first], 1, 1)] or -1, {}, {}
  for _, v in ipairs(first) do
    local q = LEVEL_OF[string.sub(v, 1, 1)]
    if q and string.byte(v, 2) == 58 then seen[q] = true end  -- "<p>:", as work_models reads
  end
  for q = 0, 3 do
    if #first < n or q < last then known[q] = seen[q] == true end
  end
  return known, seen
end

-- What the index's ends say of each level: none below its first member's level nor above its
-- last member's, work at both; nil between them (read when asked). Its first ENDS members in
-- one read: a pool with work in fewer queues than that (a drain of one model) learns every
-- level from it; a larger one reads its last member too, rather than parse a longer page.
-- (4 is written out: the claim's includes are near Lua's 200 locals a function.)
local function work_ends()
  local first = redis.call('ZRANGE', K_MODELS_WITH_WORK, '0', '3')
  if not first[1] then return {[0] = false, false, false, false} end
  if #first < 4 then return (work_levels(first, 4)) end
  local a, x = string.byte(first[1], 1, 2)  -- "<p>:": the level's digit, then 58
  local b, y = string.byte(redis.call('ZRANGE', K_MODELS_WITH_WORK, '-1', '-1')[1], 1, 2)
  local known = {}
  if not (x == 58 and y == 58 and a >= 48 and a <= 51 and b >= 48 and b <= 51) then return known end
  a, b = a - 48, b - 48
  for q = 0, 3 do
    if q < a or q > b then known[q] = false elseif q == a or q == b then known[q] = true end
  end
  return known
end

-- The index's first n members from level p on.
local function work_from(p, n)
  return redis.call('ZRANGEBYSCORE', K_MODELS_WITH_WORK, LEVEL_LOW[tonumber(p)], '+inf', 'LIMIT', '0', ms(n))
end

-- Level p's models with work, n from the start-th (0-based), in head-score order.
local function work_page(p, start, n)
  p = tonumber(p)
  return work_models(redis.call('ZRANGEBYSCORE', K_MODELS_WITH_WORK, LEVEL_LOW[p], LEVEL_HIGH[p],
    'LIMIT', ms(start), ms(n)), p)
end

-- Keep the index score of (p, m) equal to its queue's head score; drop it when empty.
local function refresh_head(p, m)
  local head = redis.call('ZRANGE', queue_key(p, m), 0, 0, 'WITHSCORES')
  if head[1] then
    redis.call('ZADD', K_MODELS_WITH_WORK, work_score(p, head[2]), work_member(p, m))
  else
    redis.call('ZREM', K_MODELS_WITH_WORK, work_member(p, m))
  end
end

-- Queue (p, m) got a task at score: the index keeps the lower of it and the head score (text:
-- score's text made by ms, when the caller has it: work_score).
local function index_head(p, m, score, text)
  redis.call('ZADD', K_MODELS_WITH_WORK, 'LT', work_score(p, score, text), work_member(p, m))
end

-- A task with a deadline is watched by the reaper's expiry pass from its latest start
-- (deadline - estimate), so only tasks near or past it are ever looked at.
local function watch_deadline(id, deadline, est_s)
  if deadline and deadline ~= '' then
    redis.call('ZADD', K_DEADLINES, tonumber(deadline) - math.floor(tonumber(est_s) * 1000), id)
  end
end

-- Index a task whose hash is written into its (priority, model) queue at its score; vram: its
-- vram_gb text, gpus: its GPUs (nil: 1).
local function index(id, p, m, score, vram, gpus)
  redis.call('ZADD', queue_key(p, m), score, id)
  index_head(p, m, score)
  redis.call('ZADD', K_NEED, need_score(tonumber(vram), vram, gpus or 1), id)
end

-- A parked task (park.lua) that goes back or ends: out of `parked`, its kept score gone.
local function unpark(id)
  redis.call('ZREM', K_PARKED, id)
  redis.call('HDEL', task_key(id), 'parked')
end

-- Take a queued task out of its queue and the indexes (the deadline index unless the
-- caller knows the task has no deadline; the queue's head in the index unless keep_head:
-- a caller taking several tasks of one queue refreshes it once, after the last).
local function unqueue(id, p, m, has_deadline, keep_head)
  set_write('ZREM', queue_key(p, m), id)
  if not keep_head then refresh_head(p, m) end
  set_write('ZREM', K_NEED, id)
  if has_deadline ~= false then set_write('ZREM', K_DEADLINES, id) end
end
