"""A host whose clock is an hour off: the scripts write liveness scores, reservation expiries
and start-by scores on the server's clock, so the reaper's planner, its pass timing and
``gpuq status`` must read "now" from the server too, or they would see every worker dead,
or a dead one alive."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from helpers import claim

from gpuq import Queue, worker_record
from gpuq.clock import server_ms
from gpuq.reaper.loop import Reaper
from gpuq.reaper.scale import Scaler
from gpuq.views.inspect import pool_view
from gpuq.worker.gpu import GpuInfo

MakeQueue = Callable[..., Queue]
GPU = "L40S"


def busy_worker(q: Queue, wid: str, est_s: float) -> str:
    """A worker with its hash as it writes it, live on the server's clock (its heartbeat),
    running a preemptible P3 task expected to take ``est_s``; the task's id."""
    gpu = GpuInfo(GPU, f"uuid-{wid}", 48, None, "declared")
    q.redis.hset(q.keys.worker(wid), mapping={
        **worker_record.identity(wid, gpu, 5.0, 1, "0123", "h", 1, handlers=["h"]),
        **worker_record.status_fields(43, 0, [], "idle", None)})
    q.scripts.run(q.calls.heartbeat(wid, []))
    task = q.enqueue("h", None, model="batch", vram_gb=30, priority="P3", est_s=est_s,
                     preemptible=True).id
    got = claim(q, wid, 43)
    assert got is not None and got["id"] == task
    return task


@pytest.mark.parametrize("skew_s", [-3600, 3600])
def test_liveness_and_reservations_are_judged_on_the_server_clock(
        make_real_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch, skew_s: int) -> None:
    q = make_real_queue(max_wait_s=3600, preempt_min_runtime_s=600, min_workers=0)
    busy_worker(q, "w-live", est_s=600)
    # the dead worker's task would end first: a planner that took it for live would pick it
    busy_worker(q, "w-dead", est_s=60)
    q.redis.zadd(q.keys.workers, {"w-dead": server_ms(q.redis) - 1000})  # its liveness lapsed
    urgent = q.enqueue("h", None, model="online", vram_gb=30, priority="P0").id

    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew_s)
    reaper = Reaper(q.redis, q.config)
    assert reaper.preemptor.step() == {"reserved": 1}
    assert q.redis.hget(q.keys.task(urgent), "reserved_for") == "w-live"

    view = pool_view(q.redis, q.keys)
    assert {w.id: w.alive for w in view.workers} == {"w-live": True, "w-dead": False}
    assert view.reservations == [{"worker": "w-live", "task": urgent}]
    assert 0 <= view.queues[0].oldest_wait_s < 60  # the P0's wait, not an hour off

    classes = {s.name: s.current for s in Scaler(q.redis, q.keys, q.config).step().signals
               if s.kind == "class"}
    assert classes == {GPU: 1}

    # a pass the planner says could decide in 0.3 s is brought forward to then
    reaper.active = True
    now, next_round = time.monotonic(), time.monotonic() + 5.0
    reaper.preemptor.quiet_until = server_ms(q.redis) + 300
    assert 0.1 < reaper.planned_pass(next_round) - now < 0.5
