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
