-- lib/names.lua: the names a task carries (id, handler, model, tenant), as enqueue checks them.

-- A name is non-empty, at most 200 bytes, without whitespace, control characters, braces or
-- commas (keys, hash tags, lists and logs carry names). %c: every ASCII control character, the
-- whitespace but the space among them. Plain finds: a bracket class costs several times as much
-- per byte; the control characters by one anchored match of %C, their complement (an
-- unanchored one tries a match at every byte, and [^%c] walks a bracket class at each: twice
-- the instructions over a task's names).
local function bad_chars(s)
  return not string.find(s, '^%C*$') or string.find(s, ' ', 1, true) or string.find(s, '{', 1, true)
    or string.find(s, '}', 1, true) or string.find(s, ',', 1, true)
end
local function bad_name(s)
  return s == '' or #s > 200 or bad_chars(s) ~= nil
end
