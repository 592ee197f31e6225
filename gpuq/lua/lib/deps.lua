-- lib/deps.lua: a parent task ends: its waiting children are released or canceled.

--@include args
--@include tenancy
--@include wake
--@include gates

-- Task id, a parent (its `children` field is "1"), ended in `state` at now; its children
-- set stays readable for ttl ms (`gpuq task` lists it). A child still waiting counts the
-- end: once all its parents ended (succeeded, or any way with after_any), it is released:
-- due now in the delayed set (state delayed, its score now + its SLA, or its deadline less
-- its estimate if earlier), whence the next claim or reaper pass queues it (lib/due.lua);
-- a pool wake makes an idle worker claim at once. A parent ended other than succeeded
-- cancels a child without after_any: returned as {child, reason} each, for finish to end
-- (its own children in turn). Children no longer waiting (canceled meanwhile) are skipped.
local function settle_children(id, state, now, ttl)
  local ck = children_key(id)
  local cancel, released, fair = {}, 0, nil
  for _, c in ipairs(redis.call('SMEMBERS', ck)) do
    local tk = task_key(c)
    local f = redis.call('HMGET', tk, 'state', 'pending', 'after_any', 'sla_ms', 'deadline', 'est_s')
    if f[1] == 'waiting' and (state == 'succeeded' or f[3] == '1') then
      local left = (finite(f[2]) or 1) - 1
      if left > 0 then
        redis.call('HSET', tk, 'pending', ms(left))
      else
        local score, deadline = now + (finite(f[4]) or 0), finite(f[5])
        if deadline then score = math.min(score, deadline - math.floor((finite(f[6]) or 0) * 1000)) end
        redis.call('HSET', tk, 'state', 'delayed', 'pending', '0', 'score', ms(score), 'due_at', ms(now))
        if fair == nil then fair = tenancy_on() end
        if fair then redis.call('HSET', tk, 'order', ms(now)) end
        redis.call('ZREM', K_WAITING, c)
        add_delayed(now, c)
        released = released + 1
      end
    elseif f[1] == 'waiting' then
      redis.call('ZREM', K_WAITING, c)
      cancel[#cancel + 1] = {c, 'parent task ' .. id .. ' ended ' .. state}
    end
  end
  redis.call('PEXPIRE', ck, ttl)
  if released > 0 then wake_pool(released) end
  return cancel
end
