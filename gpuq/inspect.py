"""Read-only views of a pool for ``gpuq status`` and ``gpuq task`` (and the exporter)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from gpuq import catalog
from gpuq.keys import Keys
from gpuq.task import Priority


@dataclass(frozen=True)
class QueueView:
    priority: str
    model: str
    depth: int
    oldest_wait_s: float


@dataclass(frozen=True)
class WorkerView:
    id: str
    gpu: str
    vram_total_gb: float
    vram_free_gb: float
    models: list[str]
    state: str
    running: list[str]
    alive: bool


@dataclass(frozen=True)
class PoolView:
    pool: str
    queues: list[QueueView]
    workers: list[WorkerView]
    running: int
    delayed: int
    unschedulable: int  # queued tasks larger than the largest registered GPU class
    unschedulable_ids: list[str]
    largest_gpu_gb: float
    stats: dict[str, int]
    models: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pool_view(client: redis.Redis, keys: Keys) -> PoolView:
    now = time.time()
    pipe = client.pipeline(transaction=False)
    for p in Priority:
        pipe.zrange(keys.models_with_work(p), 0, -1)
    pipe.zrange(keys.workers, 0, -1, withscores=True)
    pipe.zcard(keys.running)
    pipe.zcard(keys.delayed)
    pipe.hvals(keys.classes)
    pipe.hgetall(keys.stats)
    *per_level, workers, running, delayed, classes, stats = pipe.execute()

    queues: list[QueueView] = []
    pipe = client.pipeline(transaction=False)
    pairs = [(p, m) for p, models in zip(Priority, per_level) for m in models]
    for p, m in pairs:
        pipe.zcard(keys.queue(p, m))
        pipe.zrange(keys.queue(p, m), 0, 0)
    replies = pipe.execute()
    heads = [replies[i + 1][0] if replies[i + 1] else "" for i in range(0, len(replies), 2)]
    pipe = client.pipeline(transaction=False)
    for head in heads:
        pipe.hget(keys.task(head), "enqueued_at")
    enqueued = pipe.execute()
    for (p, m), depth, at in zip(pairs, replies[0::2], enqueued):
        wait = max(0.0, now - int(at) / 1000) if at else 0.0
        queues.append(QueueView(p.label, m, int(depth), round(wait, 3)))

    largest = max((float(v) for v in classes), default=0.0)
    unschedulable_ids = client.zrangebyscore(keys.need, f"({largest}", "+inf", start=0, num=20)
    unschedulable = client.zcount(keys.need, f"({largest}", "+inf")

    views = []
    pipe = client.pipeline(transaction=False)
    for wid, _ in workers:
        pipe.hgetall(keys.worker(wid))
        pipe.smembers(keys.worker_tasks(wid))
    replies = pipe.execute()
    now_ms = now * 1000
    for (wid, expiry), info, tasks in zip(workers, replies[0::2], replies[1::2]):
        views.append(WorkerView(
            id=wid, gpu=info.get("gpu_name", "?"),
            vram_total_gb=float(info.get("vram_total_gb", 0)),
            vram_free_gb=float(info.get("vram_free_gb", 0)),
            models=[m for m in info.get("models", "").split(",") if m],
            # busy/idle from the live task set; the hash's state is as of the last heartbeat
            state="draining" if info.get("state") == "draining" else ("busy" if tasks else "idle"),
            running=sorted(tasks), alive=expiry >= now_ms))
    return PoolView(
        pool=keys.pool, queues=queues, workers=views, running=int(running), delayed=int(delayed),
        unschedulable=int(unschedulable), unschedulable_ids=[str(i) for i in unschedulable_ids],
        largest_gpu_gb=largest, stats={k: int(v) for k, v in stats.items()},
        models=[asdict(e) for e in catalog.read(client, keys)])
