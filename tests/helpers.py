"""Helpers shared by the tests: act like a worker or a foreign client, under a virtual clock.

Scripts take ``now`` as an argument (``0`` = the server's clock), so tests drive time with
explicit ``now_ms`` values from ``T0`` on instead of sleeping.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gpuq import Queue, worker_record
from gpuq.config import Config
from gpuq.reaper.preempt import Victim
from gpuq.scripts import Batch, Call, Claim, ClaimRequest, ReapResult
from gpuq.task import TaskSpec
from gpuq.worker.gpu import GpuInfo, class_name
from gpuq.worker.presence import Presence

T0 = 1_700_000_000_000  # virtual clock origin (epoch ms)
RESERVE_GB = 5.0  # KV reserve of each device of a registered worker (register_worker)

# The enqueue script's per-task ARGV fields, in order (gpuq/lua/enqueue.lua header).
ENQUEUE_FIELDS = ("id", "handler", "payload", "model", "vram_gb", "priority", "est_s",
                  "deadline", "preemptible", "tenant", "max_attempts", "report_end", "gpus", "due",
                  "after", "after_any")
ENQUEUE_HEAD = 3  # now, check_fit, the SLAs of P0..P3 (one text)


def claim(queue: Queue, worker_id: str, free_gb: float, evictable_gb: float = 0, slots: int = 1,
          loaded: Sequence[tuple[str, float]] = (), levels: str = "0123",
          now_ms: int = 0, gpus: int = 1) -> dict[str, str] | None:
    """Claim like a worker: the claimed task's hash, or None (the worker is then idle)."""
    return claim_reply(queue, worker_id, free_gb, evictable_gb, slots, loaded, levels,
                       now_ms, gpus).task


def claim_reply(queue: Queue, worker_id: str, free_gb: float, evictable_gb: float = 0,
                slots: int = 1, loaded: Sequence[tuple[str, float]] = (), levels: str = "0123",
                now_ms: int = 0, gpus: int = 1,
                batches: Sequence[tuple[str, int]] = (), lookout: bool = False) -> Claim:
    """The whole claim reply: the task, or none and when a deferred task may be retried;
    with ``batches``, the tasks taken beside a batch handler's; ``lookout``: the worker is
    its shape's lookout (lib/lookout.lua)."""
    req = ClaimRequest(worker_id, free_gb, evictable_gb, slots, tuple(loaded), levels, gpus,
                       batches=tuple(batches), lookout=lookout)
    return queue.scripts.run(queue.calls.claim(req, now_ms=now_ms))


def claim_batch(queue: Queue, worker_id: str, first: dict[str, str], free_gb: float,
                footprint_gb: float = 0, *, warm: bool = True, count: int = 31,
                now_ms: int = 0) -> Batch:
    """Add up to ``count`` tasks to the batch of ``first`` (a claim's task), like a worker."""
    call = queue.calls.claim_batch(worker_id, first, free_gb, footprint_gb, warm, count, now_ms=now_ms)
    return queue.scripts.run(call)


def spec(handler: str = "h", payload: Any = None, **options: Any) -> TaskSpec:
    options.setdefault("model", "A")
    options.setdefault("vram_gb", 1)
    return TaskSpec.build(handler, payload, **options)


def enqueue(queue: Queue, now_ms: int = 0, *, check_fit: bool = False, **options: Any) -> str:
    """Enqueue one task at a virtual time; returns its id."""
    s = spec(**options)
    queue.scripts.run(queue.calls.enqueue([s], check_fit=check_fit, now_ms=now_ms))
    return s.task_id


def enqueue_specs(queue: Queue, specs: Sequence[TaskSpec], now_ms: int = 0) -> int:
    return queue.scripts.run(queue.calls.enqueue(list(specs), now_ms=now_ms))


def ack(queue: Queue, task_id: str, token: int | str, result: Any = "ok", now_ms: int = 0) -> None:
    queue.scripts.run(queue.calls.ack(task_id, int(token), json.dumps(result), now_ms=now_ms))


def fail(queue: Queue, task_id: str, token: int | str, error: str = "boom", *, retry: bool = True,
         now_ms: int = 0, pass_ms: int | None = None) -> str:
    return queue.scripts.run(queue.calls.fail(task_id, int(token), error, retry=retry, now_ms=now_ms,
                                              pass_ms=pass_ms))


def heartbeat(queue: Queue, worker_id: str, leases: Sequence[tuple[str, int | str]],
              now_ms: int = 0) -> list[str]:
    """Renew like a worker; returns the ids of the leases it lost."""
    pairs = [(tid, int(tok)) for tid, tok in leases]
    _revived, lost = queue.scripts.run(queue.calls.heartbeat(worker_id, pairs, now_ms=now_ms))
    return lost


def reap(queue: Queue, now_ms: int = 0, limit: int = 100) -> ReapResult:
    return queue.scripts.run(queue.calls.reap(limit=limit, now_ms=now_ms))


def reserve(queue: Queue, worker_id: str, task_id: str, until_ms: int) -> None:
    """A reservation of worker_id for task_id until until_ms, written as preempt.lua writes it:
    the key, and the claims' gate moved to cover it (lib/gates.lua)."""
    pipe = queue.redis.pipeline()
    pipe.set(queue.keys.reservation(worker_id), f"{task_id} {until_ms}")
    pipe.hset(queue.keys.fairness, "reserved_until", until_ms)
    pipe.execute()


def raw_enqueue_call(queue: Queue, now_ms: int = T0, **raw: str) -> tuple[str, Call[int]]:
    """An enqueue call whose ARGV fields are overridden with raw strings, as a foreign client
    would send them (e.g. ``vram_gb="abc"``); returns the task id and the call."""
    s = spec()
    call = queue.calls.enqueue([s], now_ms=now_ms)
    args = list(call.args)
    for name, value in raw.items():
        args[ENQUEUE_HEAD + ENQUEUE_FIELDS.index(name)] = value
    task_id = args[ENQUEUE_HEAD]
    return task_id, Call(call.script, args, call.parse)


def pool_keys(queue: Queue) -> set[str]:
    """Every key of the queue's pool (SCAN with the pool's pattern)."""
    return set(queue.redis.scan_iter(match=queue.keys.pattern, count=1000))


def task_keys(queue: Queue) -> set[str]:
    return {k for k in pool_keys(queue) if k.startswith(queue.keys.task(""))}


# the preemption planner's unit tests (reaper/, sim/): a clock, a config, a running victim
NOW = 1_000_000
CFG = Config(max_wait_s=30, preempt_min_runtime_s=5, preempt_max=2)


def victim(vid: str, worker: str, *, priority: int = 3, ran_s: float = 60, left_s: float = 100,
           preemptions: int = 0, usable_gb: float = 75, levels: str = "0123") -> Victim:
    started = NOW - int(ran_s * 1000)
    return Victim(vid, 1, worker, priority, started, ran_s + left_s, preemptions, usable_gb, levels)


def register_worker(q: Queue, wid: str, gpu: str = "A100", device_gb: float = 80, *, gpus: int = 1,
                    idle: bool = False, holds: tuple[str, ...] = (), levels: str = "0123") -> float:
    """A worker of ``gpus`` declared devices as presence writes it, holding ``holds``; idle
    puts it in ``idle`` with all its usable VRAM (after enqueuing: the enqueue's wake rule
    takes the worker it wakes out of ``idle``), else it runs a (pretend) task. Returns that
    usable VRAM."""
    info = GpuInfo(class_name(gpu, gpus), f"uuid-{wid}", device_gb * gpus, None, "declared", gpus)
    fields = worker_record.identity(wid, info, RESERVE_GB, 1, levels, "h", 1, handlers=["h"])
    Presence(q.redis, q.keys, wid).register(fields, 30_000)
    for model in holds:
        q.redis.sadd(q.keys.holders(model), wid)
    usable = (device_gb - RESERVE_GB) * gpus
    if idle:
        q.redis.zadd(q.keys.idle, {wid: usable})
    else:
        q.redis.sadd(q.keys.worker_tasks(wid), f"running-on-{wid}")
    return usable
