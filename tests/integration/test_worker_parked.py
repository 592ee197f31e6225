"""Tasks larger than every GPU of the pool, with real workers and a real reaper: the reaper
parks them out of their queue, so the small task behind them runs, and puts them back once
a worker of a large enough class registers (lua/park.lua)."""

from __future__ import annotations

import json

import pytest
from procs import Procs

from gpuq import Queue, State

pytestmark = pytest.mark.slow


def test_tasks_no_gpu_holds_are_parked_until_a_large_enough_worker_comes(
        procs: Procs, real_queue: Queue) -> None:
    procs.worker("small")  # 80 GB
    procs.reaper()
    # one bulk call: queued (a single task would be handed to the idle worker at enqueue)
    *big, small = real_queue.enqueue_many(
        [{"handler": "sim.run", "payload": {"s": 0.05}, "model": "m1", "vram_gb": 500}] * 8
        + [{"handler": "sim.run", "payload": {"s": 0.05}, "model": "m1", "vram_gb": 4}])
    assert procs.wait_state(small.id, State.SUCCEEDED, timeout=20).worker == "small"
    status = json.loads(procs.run_cli("status", "--json"))
    assert status["unschedulable"] == 8
    assert all(real_queue.record(t.id).state is State.QUEUED for t in big)
    assert json.loads(procs.run_cli("task", big[0].id, "--json"))["parked"] is True
    procs.worker("large", vram_gb=600)
    for t in big:
        assert procs.wait_state(t.id, State.SUCCEEDED, timeout=30).worker == "large"
