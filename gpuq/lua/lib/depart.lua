-- lib/depart.lua: a worker leaves the pool's live view, retired (retire.lua) or found dead
-- (reap.lua).

-- Worker w is no longer live nor idle, serves no lane nor level (`serving:<p>`), has no
-- `capacities` entry and is no holder of the models its hash lists (`models`, comma-
-- separated): no claim waits for it as a busy holder and no task is offered or handed to it.
local function depart(w, models)
  for m in string.gmatch(models or '', '[^,]+') do redis.call('SREM', holders_key(m), w) end
  redis.call('ZREM', K_IDLE, w)
  redis.call('ZREM', K_WORKERS, w)
  redis.call('HDEL', K_LANES, w)
  redis.call('HDEL', K_CAPACITIES, w)
  for q = 0, 3 do redis.call('SREM', serving_key(q), w) end
end
