-- lib/lookout.lua: one idle worker of a shape looks again when a deferral ends, not all.
--
-- A claim that leaves a task for a better-placed worker (or for its model's busy holders)
-- tells its worker when to look again. Every idle worker that scanned the same queues would
-- be told the same, and in a large pool they all came back at every deferral's end, each
-- with a full scan (docs/DECISIONS.md, Bounded work). Workers of one shape (claimable VRAM,
-- levels served, GPUs: the same tasks fit them, the same are left) share one lookout in
-- `lookouts` (shape -> "<due ms> <worker>"): a claim is told to look again only when no
-- idle worker of its shape is due by then; the others wait for their wake-ups (and look
-- every idle_block_s). A lookout that takes a task before its due time passes the duty to
-- an idle worker of its shape, woken to claim now.

--@include args
--@include lanes
--@include wake

-- A lookout's time to look again is rounded up to a multiple of this many ms, so that one
-- claim covers the deferrals ending within it: a task left is always a cold start (tens of
-- seconds of load), which it delays by less than this; a P0 task left for its 100 ms
-- defer bound is still claimed within its 200 ms SLA.
local LOOK_EVERY = 100

local function shape_of(claimable, levels, gpus)
  return string.format('%.17g', claimable) .. ' ' .. levels .. ' ' .. gpus
end

local function lookout_of(shape)
  local cur = redis.call('HGET', K_LOOKOUTS, shape)
  if not cur then return nil, nil end
  local due, w = string.match(cur, '^(%d+) (.+)$')
  return tonumber(due), w
end

-- A lookout took a task: the duty passes to an idle worker of its shape (not one of a
-- dedicated lane or a group of another size, nor one skipping a model: it would not scan
-- that model's queues for the others), woken with a "look" token to claim now as
-- the lookout: it takes the next task whose deferral ended and passes the duty on again,
-- or keeps it until the next deferral's end, or (nothing left) drops it.
local function pass_lookout(worker, claimable, levels, gpus, now)
  local shape = shape_of(claimable, levels, gpus)
  local _, w = lookout_of(shape)
  if w ~= worker then return end
  local room = string.format('%.17g', claimable)  -- exact: Lua's own text of a number rounds
  for _, other in ipairs(redis.call('ZRANGEBYSCORE', K_IDLE, room, room, 'LIMIT', 0, 8)) do
    local lane = other ~= worker and redis.call('HGET', K_LANES, other)  -- false: none
    local skips = false  -- any skip of its entry still in force
    for until_ms in string.gmatch(lane and string.match(lane, '^%S+(.*)$') or '', '%S+ (%d+)') do
      skips = skips or tonumber(until_ms) > now
    end
    if other ~= worker and lane_levels(lane) == levels and not skips
        and (tonumber(redis.call('HGET', worker_key(other), 'gpus')) or 1) == gpus then
      redis.call('HSET', K_LOOKOUTS, shape, ms(now) .. ' ' .. other)
      wake_worker(other, 'look')
      return
    end
  end
  redis.call('HDEL', K_LOOKOUTS, shape)
end
