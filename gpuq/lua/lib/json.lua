-- lib/json.lua: the strict JSON check of payloads, results and checkpoints.

-- Strict JSON check: the server's cjson also accepts hex numbers, nan and inf, which JSON
-- readers reject. Its leniency is a VM-wide setting, so it is restored afterwards.
local function is_json(text)
  -- a handler's None, as payload or result: JSON as it stands, without the five C calls below
  if text == 'null' then return true end
  local set = cjson.decode_invalid_numbers  -- absent in some embedded servers (already strict)
  local prev = set and set()
  if set then set(false) end
  local ok = pcall(cjson.decode, text)
  if set then set(prev) end
  return ok
end
