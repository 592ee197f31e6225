-- lib/classes.lua: GPU shapes (usable VRAM, GPUs), as a fit is judged against them.

-- The largest class with at least gpus GPUs: its usable VRAM (0: none has). classes: a list
-- of {gb, gpus} (enqueue's registered classes, or park.lua's live workers).
local function largest_with(classes, gpus)
  local largest = 0
  for _, c in ipairs(classes) do if c.gpus >= gpus then largest = math.max(largest, c.gb) end end
  return largest
end
