-- lib/lanes.lua: what a worker is offered, from its `lanes` entry.
--
-- `lanes` lists the workers that are not offered every task: "<levels>" for a dedicated lane
-- (e.g. "01"), then, for a worker whose claims skip models after their loads failed there
-- (claim.lua `skip:<ms>` pairs), " <model> <until ms>" for each. An entry whose time has
-- passed is stale, not removed: a worker's claim rewrites its entry while it skips, and a
-- reader passes over the rest, so no other claim pays for a backoff's end.

-- Each entry that lists no skips (levels alone, in order: "0", "01", ..., "0123") -> the levels
-- it serves, by text and by number: a lookup, not a match and a find, for the idle online
-- lanes every enqueue of batch work weighs.
local LANE_LEVELS = (function()
  local t, texts = {}, {[0] = '0', '1', '2', '3'}
  for mask = 1, 15 do
    local levels, set, bits = '', {}, mask
    for q = 0, 3 do
      if bits % 2 == 1 then levels, set[q], set[texts[q]] = levels .. texts[q], true, true end
      bits = (bits - bits % 2) / 2
    end
    t[levels] = set
  end
  return t
end)()

-- The levels of a `lanes` entry (nil or false: all).
local function lane_levels(lane)
  return lane and string.match(lane, '^%S+') or '0123'
end

-- Whether a worker whose `lanes` entry is `lane` (nil or false: none) serves priority p and,
-- when model m is given, does not skip m at time now.
local function lane_serves(lane, p, m, now)
  if not lane then return true end
  local served = LANE_LEVELS[lane]
  if served then return served[p] == true end  -- no skips
  local levels, skips = string.match(lane, '^(%S+)(.*)$')
  if not string.find(levels, tostring(p), 1, true) then return false end
  if m and skips ~= '' then
    for name, until_ms in string.gmatch(skips, '(%S+) (%d+)') do
      if name == m and tonumber(until_ms) > now then return false end
    end
  end
  return true
end
