"""How a worker shows itself to the pool: its hash, its GPU class, the models it holds.

These are plain writes (no reads), so they go in one pipeline rather than a script. The
worker hash fields are read by ``gpuq status`` and the reaper; docs/PROTOCOL.md tables them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import redis

from gpuq.keys import Keys
from gpuq.worker.gpu import GpuInfo

Fields = dict[Any, Any]  # hash fields; redis-py types mapping keys invariantly


def identity(worker_id: str, gpu: GpuInfo, reserve_gb: float, concurrency: int, levels: str,
             host: str, pid: int, handover: tuple[int, int, int] | None = None,
             handlers: Iterable[str] = ()) -> Fields:
    """The worker hash fields that do not change while it runs (rewritten by every
    heartbeat, so a worker the reaper took for dead shows whole again). handover: the defer
    bound (ms), fair_every and lease (ms) with which enqueue starts a task on this worker
    while it idles with one slot, blocked on its wake list; None: it takes no hand-overs.
    handlers: the handler names its app runs (shown, so tasks no live worker can run are
    flagged by status and the scale signals)."""
    defer_ms, fair_every, lease_ms = handover if handover else ("", "", "")
    return {"id": worker_id, "host": host, "pid": pid, "gpu_name": gpu.name,
            "gpu_uuid": gpu.uuid, "gpu_index": "" if gpu.index is None else gpu.index,
            "gpu_source": gpu.source, "vram_total_gb": gpu.total_gb, "kv_reserve_gb": reserve_gb,
            "concurrency": concurrency, "levels": levels,
            "handover_defer_ms": defer_ms, "fair_every": fair_every, "lease_ms": lease_ms,
            "handlers": ",".join(sorted(handlers)), "started_at": int(time.time() * 1000)}


def register(client: redis.Redis, keys: Keys, fields: Fields, lease_ms: int) -> None:
    worker_id = fields["id"]
    usable = float(fields["vram_total_gb"]) - float(fields["kv_reserve_gb"])
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


def status_fields(free_gb: float, running: int, models: list[str], state: str,
                  nvml_used_gb: float | None) -> Fields:
    fields: Fields = {"vram_free_gb": round(free_gb, 3), "running": running,
                      "models": ",".join(models), "state": state}
    if nvml_used_gb is not None:
        fields["nvml_used_gb"] = nvml_used_gb
    return fields


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
