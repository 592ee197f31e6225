-- lib/gates.lua: what a claim need not look at.
--
-- Every claim reads the `fair` hash first, in one HMGET: the fairness counters (fields 1..3)
-- and, beside them, gates that tell it which other structures can hold work for it, instead
-- of a command each probing them (most claims find them empty or nothing in them due):
--   due_at          at or before the earliest due time in `delayed` (absent: none delayed)
--   pickup_at       at or before the earliest pickup deadline in `handed` (absent: none)
--   tenancy         "1" while the `tenants` hash exists (lib/tenancy.lua)
--   reserved_until  at or after the latest expiry of a reservation (reserve:<worker>)
-- A script that adds to one of these moves its gate in the same call; removals may leave a
-- gate behind (a claim then looks once and sets it from what it finds). So a gate never
-- hides work, and a claim that skips a structure finds what looking would have found. The
-- reaper sets due_at, pickup_at and tenancy from the structures each round (reap.lua), so
-- what a client of an older release adds is seen within a round (docs/DECISIONS.md).

--@include args

-- Keep gate `name` at or before time `at` (ms), for an entry added at `at`; true if moved.
local function gate_before(name, at)
  local g = finite(redis.call('HGET', K_FAIRNESS, name))
  if not g or at < g then
    redis.call('HSET', K_FAIRNESS, name, ms(at))
    return true
  end
  return false
end

-- Task id into `delayed`, due at time `at` (ms), its gate moved. A new earliest due time
-- wakes the active reaper (token "due", behind a pending "1": that wake reads it too), which
-- may be waiting for a later one: it promotes the task at its due time, not a round late.
local function add_delayed(at, id)
  redis.call('ZADD', K_DELAYED, ms(at), id)
  if gate_before('due_at', at) and redis.call('LINDEX', K_URGENT, 0) ~= '1' then
    redis.call('LPUSH', K_URGENT, 'due')
    redis.call('LTRIM', K_URGENT, 0, 0)
  end
end

-- Set gate `name` to the first score of sorted set `key`, or drop it when the set is empty.
local function gate_head(name, key)
  local head = redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')
  if head[2] then redis.call('HSET', K_FAIRNESS, name, head[2])
  else redis.call('HDEL', K_FAIRNESS, name) end
end

-- Set the tenancy gate from whether the `tenants` hash exists; returns whether it does.
local function gate_tenancy()
  local on = redis.call('EXISTS', K_TENANTS) == 1
  if on then redis.call('HSET', K_FAIRNESS, 'tenancy', '1')
  else redis.call('HDEL', K_FAIRNESS, 'tenancy') end
  return on
end
