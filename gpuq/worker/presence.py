"""How a worker shows itself to the pool: its hash, its GPU class, the models it holds.

These are plain writes (no reads), so they go in one pipeline rather than a script. The
worker hash fields are read by ``gpuq status`` and the reaper; docs/PROTOCOL.md tables them.
"""

from __future__ import annotations

import time

import redis

from gpuq.keys import Keys
from gpuq.worker_record import Fields, status_fields, usable_gb


def register(client: redis.Redis, keys: Keys, fields: Fields, lease_ms: int) -> None:
    worker_id = fields["id"]
    usable = usable_gb(fields["vram_total_gb"], fields["kv_reserve_gb"])
    now_ms = int(time.time() * 1000)
    pipe = client.pipeline(transaction=True)
    pipe.delete(keys.worker(worker_id), keys.worker_tasks(worker_id), keys.wake(worker_id),
                keys.control(worker_id), keys.reservation(worker_id))
    pipe.hset(keys.worker(worker_id), mapping={
        **fields, **status_fields(usable, 0, [], "idle", None), "seen_at": now_ms})
    pipe.hset(keys.classes, fields["gpu_name"], usable)
    if fields["handlers"]:
        pipe.sadd(keys.handlers, *fields["handlers"].split(","))
    if fields["levels"] == "0123":
        pipe.hdel(keys.lanes, worker_id)
    else:  # wake-ups and offers skip a lane worker for the priorities it does not serve
        pipe.hset(keys.lanes, worker_id, fields["levels"])
    # liveness comes from the server clock at the first heartbeat; this bridges until then
    pipe.zadd(keys.workers, {worker_id: now_ms + lease_ms})
    pipe.execute()


def hold(pipe: redis.client.Pipeline, keys: Keys, worker_id: str, model: str, held: bool) -> None:
    if held:
        pipe.sadd(keys.holders(model), worker_id)
    else:
        pipe.srem(keys.holders(model), worker_id)


def leave(client: redis.Redis, keys: Keys, worker_id: str, models: list[str]) -> None:
    """Clean exit: nothing of this worker is left for the reaper to recover."""
    pipe = client.pipeline(transaction=True)
    for model in models:
        hold(pipe, keys, worker_id, model, False)
    pipe.zrem(keys.idle, worker_id)
    pipe.zrem(keys.workers, worker_id)
    pipe.hdel(keys.lanes, worker_id)
    pipe.delete(keys.worker(worker_id), keys.worker_tasks(worker_id), keys.wake(worker_id),
                keys.control(worker_id), keys.reservation(worker_id))
    pipe.execute()
