"""Tasks no live worker can hold, with real workers and a real reaper: the reaper parks them
out of their queue, so the small tasks behind them run, and puts them back once a worker
that holds them registers (lua/park.lua)."""

from __future__ import annotations

import json

import pytest
from procs import Procs, wait_for

from gpuq import Queue, State

pytestmark = pytest.mark.slow

SMALL = {"handler": "sim.run", "payload": {"s": 0.05}, "model": "m1", "vram_gb": 4}
BIG = {**SMALL, "vram_gb": 500}


def test_tasks_no_gpu_holds_are_parked_until_a_large_enough_worker_comes(
        procs: Procs, real_queue: Queue) -> None:
    procs.worker("small")  # 80 GB
    procs.reaper()
    # one bulk call: queued (a single task would be handed to the idle worker at enqueue)
    *big, small = real_queue.enqueue_many([BIG] * 8 + [SMALL])
    assert procs.wait_state(small.id, State.SUCCEEDED, timeout=20).worker == "small"
    status = json.loads(procs.run_cli("status", "--json"))
    assert status["unschedulable"] == 8 and status["parked"] == 8
    assert all(real_queue.record(t.id).state is State.QUEUED for t in big)
    assert json.loads(procs.run_cli("task", big[0].id, "--json"))["parked"] is True
    procs.worker("large", vram_gb=600)
    for t in big:
        assert procs.wait_state(t.id, State.SUCCEEDED, timeout=30).worker == "large"


def test_tasks_only_a_departed_worker_held_no_longer_hold_their_queue(
        procs: Procs, real_queue: Queue) -> None:
    """Regression: a GPU class stays registered after its last worker leaves, and parking
    weighed every class ever registered: once the large worker left, tasks only it held
    were not parked and kept the small ones behind them from starting."""
    procs.worker("small")
    procs.reaper()
    large = procs.worker("large", vram_gb=600)
    large.terminate()
    assert large.wait() == 0
    *big, small = real_queue.enqueue_many([BIG] * 8 + [SMALL])
    assert procs.wait_state(small.id, State.SUCCEEDED, timeout=20).worker == "small"
    status = json.loads(procs.run_cli("status", "--json"))
    assert status["parked"] == 8 and status["unschedulable"] == 0  # a class holds them


def test_a_burst_worker_runs_the_parked_tasks_it_can_hold_before_it_leaves(
        procs: Procs, real_queue: Queue) -> None:
    """Found by a groups user: a burst worker that alone could hold the parked tasks found
    its first claim empty (parked: out of their queues until the reaper's next pass) and
    left at once, tasks=0. Here no reaper runs by then: the worker puts them back itself."""
    procs.worker("small")
    reaper = procs.reaper()
    *big, small = real_queue.enqueue_many([BIG] * 3 + [SMALL])
    assert procs.wait_state(small.id, State.SUCCEEDED, timeout=20).worker == "small"
    wait_for(lambda: procs.redis.zcard(procs.keys.parked) == 3, 10, message="the reaper to park them")
    reaper.terminate()
    assert reaper.wait() == 0
    burst = procs.worker("large", vram_gb=600, burst=True, wait=False)
    assert burst.wait(30) == 0, burst.log()
    for t in big:
        assert real_queue.record(t.id).state is State.SUCCEEDED, burst.log()
    assert "task.unparked worker=large put_back=3" in burst.log()
