"""Run times learned from a real worker process (``python -m gpuq worker``): its heartbeat
sends the runs it measured to learn.lua within a beat or two, or when it stops, and a task
enqueued afterwards without est_s gets the learned mean."""

from __future__ import annotations

import pytest
from procs import SCALE, Procs, wait_for

from gpuq import Queue, State

pytestmark = pytest.mark.slow
PAIR = "sim.run m-learn"


def learned(q: Queue) -> tuple[float, float, int] | None:
    v = q.redis.hget(q.keys.runtimes, PAIR)
    if v is None:
        return None
    mean, p90, n = v.split()
    return float(mean), float(p90), int(n)


def run_without_estimates(procs: Procs, q: Queue, n: int) -> None:
    """n tasks with no est_s: nothing learned yet, so each gets 1 s (0.1 s of wall time)."""
    tasks = [q.enqueue("sim.run", model="m-learn", vram_gb=10) for _ in range(n)]
    assert all(t.record().est_s == 1.0 and t.record().est_from is None for t in tasks)
    procs.wait_all([t.id for t in tasks], State.SUCCEEDED)


def test_a_workers_heartbeat_teaches_run_times_and_enqueue_uses_them(procs: Procs,
                                                                      real_queue: Queue) -> None:
    procs.worker("w1")
    run_without_estimates(procs, real_queue, 3)
    # heartbeats every 0.5 s here: the runs arrive within a few
    mean, p90, n = wait_for(lambda: (v := learned(real_queue)) and v[2] == 3 and v, timeout=3.0,
                            message=lambda: f"3 runs in runtimes; logs:\n{procs.logs()}")
    assert SCALE <= mean < SCALE + 0.3 and p90 > 0  # the handler's wall time, not the load's
    task = real_queue.enqueue("sim.run", model="m-learn", vram_gb=10)
    record = task.record()
    assert record.est_from == "history" and record.est_s == pytest.approx(mean)
    procs.wait_state(task.id, State.SUCCEEDED)


def test_a_stopping_worker_sends_the_runs_its_heartbeat_has_not(procs: Procs,
                                                                real_queue: Queue) -> None:
    """With a beat due only in 20 s, the runs wait in the worker until SIGTERM sends them."""
    worker = procs.worker("w1", env={"GPUQ_HEARTBEAT_S": "20", "GPUQ_LEASE_S": "60"})
    run_without_estimates(procs, real_queue, 2)
    assert learned(real_queue) is None
    worker.terminate()
    assert worker.wait() == 0
    stored = learned(real_queue)
    assert stored is not None and stored[2] == 2, procs.logs()
