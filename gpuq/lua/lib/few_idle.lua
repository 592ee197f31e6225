-- lib/few_idle.lua: the wake rule's reads when few workers idle (lib/wake.lua `pick`).

--@include lanes

-- What pick reads while at most 8 workers idle, for a one-GPU task: the idle workers with room
-- (score >= need, in score then name order: ZINTER's for idle_holder, tightest's own read)
-- and their lanes, one read each; the holders among those serving p and not skipping m are
-- asked in one SMISMEMBER, and only when one is left: a pool whose idle workers are online
-- lanes pays two reads for a batch task, not four. Returns the idle holder, else false and
-- the tightest fit.
local function pick_few(m, need, p, now)
  local got = redis.call('ZRANGEBYSCORE', K_IDLE, need, '+inf', 'LIMIT', '0', '8')
  if not got[1] then return false, nil end
  -- idle lanes share their entries (e.g. "0" for each online lane): an entry is read once
  local lanes, serving, said = redis.call('HMGET', K_LANES, unpack(got)), {}, {}
  for i = 1, #got do
    local lane = lanes[i]
    local serves = not lane or said[lane]
    if serves == nil then
      serves = lane_serves(lane, p, m, now)
      said[lane] = serves
    end
    if serves then serving[#serving + 1] = got[i] end
  end
  if not serving[1] then return false, nil end
  local held = redis.call('SMISMEMBER', holders_key(m), unpack(serving))
  for i = 1, #serving do
    if held[i] == 1 then return serving[i] end
  end
  return false, serving[1]  -- in score order: the tightest fit
end
