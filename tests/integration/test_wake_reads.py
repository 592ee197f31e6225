"""What the wake rule reads (lib/wake.lua), counted in the real server's command stats."""

from __future__ import annotations

from helpers import T0, enqueue, register_worker

from gpuq import Queue


def reads(q: Queue) -> dict[str, int]:
    stats = q.redis.info("commandstats")
    return {c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hget", "hmget")}


def test_the_tightest_idle_workers_lanes_come_in_one_read(real_queue: Queue) -> None:
    """Eight idle online lanes are the tightest idle fit of a P2 task: its enqueue weighs
    them with one HMGET of their lanes, not an HGET each (one a lane, every enqueue)."""
    q = real_queue
    for i in range(8):
        register_worker(q, f"lane-{i}", idle=True, levels="0")
    before = reads(q)
    tid = enqueue(q, T0, model="m", vram_gb=20, priority="P2")
    after = reads(q)
    # hget: the task's learned run time (enqueue.lua), read whatever idles
    assert {k: after[k] - before[k] for k in after} == {"hget": 1, "hmget": 1}
    # none serves P2: the task is offered to nobody and every lane stays idle
    assert q.redis.hget(q.keys.task(tid), "offered") is None
    assert q.redis.zcard(q.keys.idle) == 8


def test_a_batch_task_reads_few_idle_lanes_once(real_queue: Queue) -> None:
    """At most 8 idle workers: a P2 enqueue reads those with room and their lanes once; none
    serves P2, so it asks no holders set (before: a ZINTER of idle and the model's holders,
    then the tightest fit's read of the same idle workers)."""
    q = real_queue
    for i in range(8):
        register_worker(q, f"lane-{i}", idle=True, levels="0", holds=("m",) if i % 2 else ())
    stats = q.redis.info("commandstats")
    names = ("zinter", "zrangebyscore", "smismember")
    before = {c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in names}
    tid = enqueue(q, T0, model="m", vram_gb=20, priority="P2")
    stats = q.redis.info("commandstats")
    after = {c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in names}
    assert {k: after[k] - before[k] for k in after} == {"zinter": 0, "zrangebyscore": 1, "smismember": 0}
    assert q.redis.hget(q.keys.task(tid), "offered") is None
    assert q.redis.zcard(q.keys.idle) == 8


def test_few_idle_workers_offer_to_the_holder_that_serves_the_level(queue: Queue) -> None:
    """With few idle workers the wake rule decides as with many: the tightest idle holder
    that serves the task's level (a lane holding the model is passed over), else the
    tightest idle worker that serves it."""
    register_worker(queue, "lane", device_gb=40, idle=True, levels="0", holds=("m",))
    register_worker(queue, "roomy", device_gb=80, idle=True, holds=("m",))
    register_worker(queue, "tight", device_gb=32, idle=True)
    held = enqueue(queue, T0, model="m", vram_gb=20, priority="P2")
    assert queue.redis.hget(queue.keys.task(held), "offered") == "roomy"
    cold = enqueue(queue, T0 + 1, model="other", vram_gb=20, priority="P2")
    assert queue.redis.hget(queue.keys.task(cold), "offered") == "tight"
