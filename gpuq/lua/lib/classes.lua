-- lib/classes.lua: the GPU classes ever registered, as a fit is judged against them.

--@include args

-- Every class's usable VRAM (GB) and GPUs a group (one-GPU classes are not in class_gpus),
-- and the most GPUs of any class.
local function read_classes()
  local kv, g, count = redis.call('HGETALL', K_CLASSES), redis.call('HGETALL', K_CLASS_GPUS), {}
  local classes, most = {}, 0
  for i = 1, #g, 2 do count[g[i]] = tonumber(g[i + 1]) end
  for i = 1, #kv, 2 do
    classes[#classes + 1] = {gb = finite(kv[i + 1]) or 0, gpus = count[kv[i]] or 1}
    most = math.max(most, count[kv[i]] or 1)
  end
  return classes, most
end

-- The largest class with at least gpus GPUs: its usable VRAM (0: none has).
local function largest_with(classes, gpus)
  local largest = 0
  for _, c in ipairs(classes) do if c.gpus >= gpus then largest = math.max(largest, c.gb) end end
  return largest
end
