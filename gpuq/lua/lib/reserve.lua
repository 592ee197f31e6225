-- lib/reserve.lua: reservations the preemption planner makes, and their withdrawal.

--@include args

-- The task worker w is reserved for ("<task> <expires ms>" in reserve:<w>), if the
-- reservation has not expired by now. The expiry is in the value, not the key's TTL, so a
-- replay on a virtual clock sees it end at the same virtual time however fast it runs.
-- Also whether the key was read and found. gate: the claims' gate (lib/gates.lua), if read:
-- at or before now, every reservation has expired and the key is not read.
local function reserved_task(w, now, gate)
  if gate and gate <= now then return nil, false end
  local v = redis.call('GET', reservation_key(w))
  if not v then return nil, false end
  local id, at = string.match(v, '^(%S+) (%d+)$')
  if id and tonumber(at) > now then return id, true end
  return nil, true
end

-- The request to victim, asked to yield for task id, withdrawn if that still runs and has
-- not yielded: taken off its worker's control list if not read yet, else undone by
-- "unyield" (the list is popped newest first, so it must not overtake its "yield").
local function withdraw_one(id, victim)
  local v = redis.call('HMGET', task_key(victim), 'state', 'yield_for', 'worker', 'priority')
  if v[1] ~= 'running' or v[2] ~= id then return end
  redis.call('HDEL', task_key(victim), 'yield_by', 'yield_for')
  redis.call('HINCRBY', K_STATS, 'preempt:withdrawn', 1)
  if level(v[4]) then redis.call('HINCRBY', K_STATS, 'preempt:withdrawn:P' .. v[4], 1) end
  if not v[3] or v[3] == '' then return end  -- a corrupt victim names no worker to tell
  local ctl = control_key(v[3])
  for _, msg in ipairs(redis.call('LRANGE', ctl, 0, -1)) do
    if string.sub(msg, 1, 7 + #victim) == 'yield ' .. victim .. ' ' then
      redis.call('LREM', ctl, 1, msg)
      return
    end
  end
  redis.call('LPUSH', ctl, 'unyield ' .. victim)
end

-- Tell worker w at once that its run of task id under token is no longer its own (a cancel,
-- an operator's requeue): its handler sees should_stop now, not at the next heartbeat.
local function tell_lost(w, id, token)
  redis.call('LPUSH', control_key(w), 'lost ' .. id .. ' ' .. (token or ''))
end

-- A waiting task that starts or ends no longer needs the room the planner made for it:
-- the reservation it holds on worker w (its reserved_for) is dropped, and the request to
-- each victim asked to yield for it (its yield_victim: ids, space-separated) withdrawn.
local function withdraw_yield(id, w, victims, now)
  if not w or w == '' then return end
  redis.call('HDEL', task_key(id), 'reserved_for', 'yield_victim')
  if reserved_task(w, now) == id then redis.call('DEL', reservation_key(w)) end
  for victim in string.gmatch(victims or '', '%S+') do withdraw_one(id, victim) end
end
