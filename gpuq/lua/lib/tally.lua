-- lib/tally.lua: writes that a call about many tasks makes once (a batch's claim or its acks).
--
-- Between tally_on and tally_flush, stats counters are added up and the members of the
-- running set and of workers' task sets gathered per key, then written with one command
-- each: a batch of 32 tasks pays one HINCRBY per counter instead of 32. No script reads
-- these back within the call before the flush (a caller that would, flushes first).
-- Without tally_on each write is made at once.

local tally = false

-- Begin gathering the writes below; tokens: fencing tokens to take in one INCRBY for the
-- tasks the call may start (unused ones are skipped: a token only has to be new).
local function tally_on(tokens)
  local last = tally and tally.tokens  -- a flush keeps the tokens left
  tally = {counts = {}, counted = {}, writes = {}, members = {}, tokens = last}
  if tokens and tokens > 0 then
    local top = redis.call('INCRBY', K_TOKEN, tokens)
    tally.tokens = {next = top - tokens + 1, last = top}
  end
end

-- A new fencing token for a task that starts: the next one taken by tally_on, else INCR.
local function new_token()
  local t = tally and tally.tokens
  if not (t and t.next <= t.last) then return redis.call('INCR', K_TOKEN) end
  t.next = t.next + 1
  return t.next - 1
end

-- HINCRBY K_STATS field 1, now or at the flush.
local function count_stat(field)
  if not tally then
    redis.call('HINCRBY', K_STATS, field, '1')
  elseif tally.counts[field] then
    tally.counts[field] = tally.counts[field] + 1
  else
    tally.counts[field] = 1
    tally.counted[#tally.counted + 1] = field
  end
end

-- A set write (verb ZADD, ZREM, SADD or SREM on key; for ZADD a is the score and b the
-- member, else a is the member), now or at the flush, in the order asked per key. Gathered
-- per verb, then key: no key text is built per write (a batch makes six a task).
local function set_write(verb, key, a, b)
  if not tally then
    if b == nil then return redis.call(verb, key, a) end
    return redis.call(verb, key, a, b)
  end
  local by_key = tally.members[verb]
  if not by_key then
    by_key = {}
    tally.members[verb] = by_key
  end
  local got = by_key[key]
  if not got then
    got = {verb = verb, key = key}
    by_key[key] = got
    tally.writes[#tally.writes + 1] = got
  end
  got[#got + 1] = a
  if b ~= nil then got[#got + 1] = b end
end

-- Write what was gathered; gathering goes on.
local function tally_flush()
  if not tally then return end
  for _, field in ipairs(tally.counted) do
    redis.call('HINCRBY', K_STATS, field, tally.counts[field])
  end
  for _, w in ipairs(tally.writes) do
    for i = 1, #w, 1000 do  -- an even count, so ZADD's pairs stay whole
      redis.call(w.verb, w.key, unpack(w, i, math.min(#w, i + 999)))
    end
  end
  tally_on()
end
