-- lib/batch.lua: a batch handler's claim takes more queued tasks of its handler and model.

--@include queue
--@include readable
--@include quota
--@include take
--@include tally

-- Each field of READ_HELD by its place there (lib/readable.lua's order).
local READ_AT = (function()
  local at = {}
  for i = 1, #READ_HELD do at[READ_HELD[i]] = i end
  return at
end)()

-- Task id's fields of READ_HELD, by place (false where absent, as HMGET gives them), read
-- whole with HGETALL: a queued task holds some 14 fields and lacks about 10 of the 23, and
-- HMGET scans a small hash's listpack once per field asked, to its end for an absent one,
-- then takes 23 arguments in; HGETALL walks it once and takes none. Rather than a second
-- read, a queued task's few other fields (a retried one's error) come along.
local function read_held(id)
  local all = redis.call('HGETALL', task_key(id))
  local g = {false, false, false, false, false, false, false, false, false, false, false, false,
    false, false, false, false, false, false, false, false, false, false, false, false,
    vram = false, score = false, enqueued = false, due = false}  -- readable's: no rehash
  for i = 1, #all, 2 do
    local at = READ_AT[all[i]]
    if at then g[at] = all[i + 1] end
  end
  return g
end

-- Start up to `count` more queued tasks of handler h from queue (p, m) on worker w, beside a
-- task of that queue it runs (a batch: claim.lua when it takes the first, claim_batch.lua
-- after), each as claim starts one (lib/take.lua: its own token, lease, attempt and SLA
-- decision; its tenant charged). Oldest (lowest score) first, at most `scan` ids examined:
-- O(scan x log N). The batch shares the worker's loaded model (footprint GB): a task fits
-- when its working memory, max(0, vram_gb - footprint), fits the `free` GB left after the
-- tasks taken before it (no model is evicted for it). A task of another handler, or asking
-- more than `gpus` GPUs, is passed over; a stale id leaves the queue; a corrupt one is failed
-- (lib/readable.lua, its result kept ttl ms); one whose tenant is at a quota is passed over.
-- Each task's claim reply values are appended to `out`, those that differ from the first
-- task's (lib/take.lua, `batched`; no names: each element of a reply costs the server a
-- conversion and the worker a parse). Writes are gathered
-- (lib/tally.lua) and made once; the queue's head in the index is left to the caller.
-- Returns how many were taken, the GB they use, their earliest start-by score (`bound` if
-- none is earlier) and whether the queue held any id (its head then needs a refresh).
local function take_batch(p, m, h, gpus, w, now, lease_until, free, footprint, warm, count, scan,
                          tenancy, ttl, bound, out)
  local used, taken = 0, 0
  if count < 1 then return 0, 0, bound, false end
  tally_on(count)
  -- ids read a page at a time, as many as are still wanted (and a few more): a queue whose
  -- tasks all fit is read once, not `scan` deep
  local q, x, seen, ids, i = queue_key(p, m), N_READABLE, 0, {}, 1
  while taken < count do
    if i > #ids then
      local want = math.min(count - taken + 4, scan - seen)
      -- the queue is as it was: its removals are gathered until the flush below
      ids, i = want > 0 and redis.call('ZRANGE', q, seen, seen + want - 1) or {}, 1
      if not ids[1] then break end
    end
    local id = ids[i]
    i, seen = i + 1, seen + 1
    local g = read_held(id)
    if g[x + 2] ~= 'queued' then
      unqueue(id, p, m, nil, true)  -- a stale entry: nothing to run
    elseif g[1] == h and (tonumber(g[x + 3]) or 1) <= gpus then
      local f = readable(id, p, m, now, ttl, g)  -- nil: corrupt, failed
      local need = f and f.vram
      local use = need and math.max(0, need - footprint)
      local over = f and tenancy and over_quota(f[9], need, tonumber(g[x + 3]) or 1)
      if f and use <= free - used + 1e-9 and not over then
        out[#out + 1] = take(id, p, m, w, now, lease_until, f, warm, tenancy, true, true)
        used, taken = used + use, taken + 1
        bound = math.min(bound, f.score)
      end
    end
  end
  tally_flush()
  return taken, used, bound, seen > 0
end
