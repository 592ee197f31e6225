-- lib/classes.lua: GPU shapes (usable VRAM, GPUs), as a fit is judged against them, and a
-- task's score in the `need` index, which finds the queued tasks no shape can hold.

-- A task's score in `need` (and `parked`): a one-GPU task's VRAM, a task across g GPUs
-- g x NEED_WIDE + its VRAM, so the tasks no shape holds lie in a few score ranges of one set
-- (gpuq/shapes.py reads it the same way). VRAM counts up to NEED_CAP there: no GPU is larger.
-- A wide score keeps VRAM to 1/64 GB at 64 GPUs, finer below.
local NEED_WIDE = 2 ^ 40
local NEED_CAP = 2 ^ 39

-- The largest class with at least gpus GPUs: its usable VRAM (0: none has). classes: a list
-- of {gb, gpus} (enqueue's registered classes, or park.lua's live workers).
local function largest_with(classes, gpus)
  local largest = 0
  for _, c in ipairs(classes) do if c.gpus >= gpus then largest = math.max(largest, c.gb) end end
  return largest
end

local function score_text(x) return string.format('%.17g', x) end

-- A task's `need` score as text; vram_s, its VRAM's own text, is the score of most tasks.
local function need_score(vram, vram_s, gpus)
  if gpus <= 1 and vram <= NEED_CAP then return vram_s end
  return score_text((gpus > 1 and gpus * NEED_WIDE or 0) + math.min(vram, NEED_CAP))
end
