-- lib/failures.lua: a task ends failed for good, and is noted for `gpuq failures`.

--@include args
--@include finish

-- The first n bytes of text, cut back to a whole UTF-8 character.
local function clip(text, n)
  if #text <= n then return text end
  while n > 0 and text:byte(n + 1) >= 128 and text:byte(n + 1) < 192 do n = n - 1 end
  return text:sub(1, n)
end

-- End task id failed with error err (finish), noted first in `failures` (newest first, the
-- last 100: gpuq/keys.py FAILURES_KEPT), while its hash is there to read (a TTL of 0 deletes
-- it). Only a final failure pays this: a retry, an ack, an expiry or a cancel does not.
local function end_failed(id, now, ttl, err)
  local f = redis.call('HMGET', task_key(id), 'handler', 'model', 'priority', 'tenant', 'attempt')
  local p = level(f[3])
  redis.call('LPUSH', K_FAILURES, cjson.encode({id = id, handler = f[1] or '', model = f[2] or '',
    priority = p and 'P' .. p or '', tenant = f[4] or '', attempt = finite(f[5]) or 0,
    error = clip(err, 200), at = now / 1000}))
  redis.call('LTRIM', K_FAILURES, 0, 99)
  finish(id, 'failed', now, ttl, 'error', err)
end
