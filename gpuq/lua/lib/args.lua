-- lib/args.lua: reading arguments and numbers; the conventions every script follows.
--
-- gpuq/lua_source.py puts before each script the key names it uses, defined over the pool's
-- key base (e.g. "gpuq:{default}:"), the script's one key, KEYS[1]: all of them carry the
-- pool's hash tag, so a script touches one Cluster slot (gpuq/keys.py; docs/PROTOCOL.md).
-- Then come the helper groups it includes (this directory), each once, then the script.
-- Times are integer epoch milliseconds. Return values are arrays whose first element is a
-- code: 0 OK, 1 INVALID, 2 DUPLICATE, 3 UNSCHEDULABLE, 4 NOT_FOUND, 5 STALE_LEASE,
-- 6 FINISHED, 7 UNREGISTERED (gpuq/replies.py: Code).

-- ms's last number and its text (state sits in a group's head: gpuq/lua_source.py keeps a
-- script's reached helpers only)
local last_ms, last_text = nil, nil
-- 0..99 as text and back without a C call (string.format, or tonumber's strtod: some 1k
-- instructions each): counts, attempts, slots, GPUs, GB and the claim's settings are mostly
-- such. Made by concatenation: a library's load sees no globals.
local DIGIT = (function()
  local t = {}
  for i = 0, 99 do t[i] = i .. '' end
  return t
end)()
local SMALL = (function()
  local t = {}
  for i = 0, 99 do t[i .. ''] = i end
  return t
end)()

-- A text as a finite number, or nil: tonumber also reads "nan", "inf" and "1e309".
-- Tests here are arithmetic, not math.huge or math.floor: each of those is a global
-- lookup (and math.floor a C call) on lines every claim runs some twenty times.
local function finite(text)
  if not text then return nil end  -- an absent field (false): no C call
  local n = SMALL[text] or tonumber(text)
  if n and n - n == 0 then return n end  -- inf - inf and nan - nan are nan
  return nil
end

-- ARGV[i] as a number in [lo, hi] (an integer with int), or nil. Scripts check every
-- argument before they write: a malformed call is answered {1, 0, reason} (INVALID) and
-- changes nothing, rather than stopping on a Lua error halfway through its writes.
local function arg_num(i, lo, hi, int)
  local t = ARGV[i]  -- finite bounds: nan, inf and 1e309 fail them
  local n = t and #t < 3 and SMALL[t] or tonumber(t)
  if n and n >= lo and n <= hi and (not int or n % 1 == 0) then return n end
  return nil
end

-- ARGV[i] as a result TTL (ms): up to 13 digits (317 years) without a leading zero, kept as
-- text as PEXPIRE takes it (it refuses "0123"); nil for anything else.
local function ttl_arg(i)
  local t = ARGV[i]
  if t and #t <= 13 and (t == '0' or string.find(t, '^[1-9]%d*$')) then return t end
  return nil
end

-- A priority as its level's text ("0".."3"; from text or a number), or nil.
local function level(p)
  if p == '0' or p == '1' or p == '2' or p == '3' then return p end  -- a field's text: as it is
  p = tostring(p)
  if p == '0' or p == '1' or p == '2' or p == '3' then return p end
  return nil
end

-- ARGV "0" or "" means: use the server's clock, so hosts with skewed clocks agree; else an
-- integer ms up to 1e15 (the year 33658), as text or (a joined call's, gpuq/lua_source.py)
-- a number. nil for anything else (callers answer INVALID). TIME's two fields are digits:
-- arithmetic reads each once, where tonumber reads a text twice (two strtod calls).
local function clock(arg)
  local n = (arg == '0' or arg == '') and 0 or finite(arg)
  if n == 0 then
    local t = redis.call('TIME')
    return t[1] * 1000 + math.floor(t[2] / 1000)
  end
  if n and n > 0 and n <= 1e15 and n % 1 == 0 then return n end
  return nil
end

-- An integer ms as text. The last one is kept (last_ms, above): a call formats its `now`
-- for every task.
local function ms(n)
  if n ~= last_ms then last_ms, last_text = n, DIGIT[n] or string.format('%d', n) end
  return last_text
end
