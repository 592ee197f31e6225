-- lib/take.lua: a queued task a claim chose starts on the claiming worker; its reply values.

--@include args
--@include queue
--@include tenancy
--@include quota
--@include reserve
--@include start

-- Start task id of queue (p, m) on worker w until lease_until, as every claim starts one
-- (claim.lua, and each task claim_batch.lua adds to a batch): out of its queue and its
-- tenant's count; a yield asked for it withdrawn (it starts here: the victim keeps running);
-- `start` (token, lease, SLA: decided now when warm, the worker holding its model); its
-- tenant charged (tenancy on); a cold start noted. f: its fields (`readable`), read before
-- the attempt is written; the deadline index is touched only if it has one; keep_head: the
-- caller refreshes the queue's head in the index (unqueue). Returns the claim reply for the
-- task, {0, 'task', value, ...} in the order of the `task` names below, built in one
-- constructor (sized once, no loop); `batched` (a task beside a batch's first): the values
-- that differ from the first's, in `batched` order (not its handler, model and priority, the
-- first's, nor its start time, the call's). Values alone: each element of a reply costs the
-- server a conversion and the worker a parse. gpuq/claims.py reads the names from these
-- lines (a reply's lines join), so the library's digest covers their order
-- (gpuq/functions.py): a worker never calls a library that orders them otherwise.
--@reply task id token handler payload model vram_gb priority est_s attempt deadline tenant
--@reply task checkpoint enqueued_at queued_at started_at sla due_at
--@reply batched id token payload vram_gb est_s attempt deadline tenant checkpoint enqueued_at
--@reply batched queued_at sla due_at
local function take(id, p, m, w, now, lease_until, f, warm, tenancy, keep_head, batched)
  unqueue(id, p, m, f[8] ~= '', keep_head)
  fair_leave(id, f[18])
  withdraw_yield(id, f[14], f[15], now)
  local undecided = not f[17] or f[17] == ''  -- no handler start has decided its SLA yet
  -- a miss's wait counts from when the task was due (a delayed or released one), else enqueued
  local token, sla = start(id, p, m, w, now, lease_until, f[7], f.score, f.due or f.enqueued,
    undecided, warm, f[24])  -- READ_HELD's error: false when the hash has none
  if tenancy then
    charge(id, f[9], f.vram)
    count_tenant_sla(p, f[9], sla)
    -- the level's lag: how far behind its place in the queue service is now (fair_order)
    local place = finite(f[19]) or f.score or now
    redis.call('HSET', K_TENANT_CLOCK, tostring(p), ms(math.max(0, now - place)))
  end
  if not warm then note_cold_start(id, m, now) end
  local due = f.due and ms(f.due) or ''
  if batched then
    return {id, token, f[2], f[4], f[6], f[7], f[8], f[9], f[10] or '', f[11], f[12], sla, due}
  end
  return {0, 'task', id, token, f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10] or '',
    f[11], f[12], ms(now), sla, due}
end
