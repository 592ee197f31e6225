"""A real worker process as its shape's lookout (lib/lookout.lua), against real Redis."""

from __future__ import annotations

import time

import pytest
from procs import Procs, est

from gpuq import Queue, State

pytestmark = pytest.mark.slow


def test_a_task_left_for_a_holder_that_died_idle_runs_on_the_lookout_at_its_defer_bound(
        procs: Procs, real_queue: Queue) -> None:
    # a holder with two slots is woken for its model's tasks, never handed one
    holder = procs.worker("holder", concurrency=2)
    first = real_queue.enqueue("sim.run", model="model-a", vram_gb=8, est_s=est(0.05))
    procs.wait_state(first.id, State.SUCCEEDED)
    procs.wait_idle("holder")
    holder.kill()  # it dies idle: still listed idle and as model-a's holder (no reaper runs)
    holder.wait()
    # the other worker looks only when told to (or after a minute)
    procs.worker("other", env={"GPUQ_IDLE_BLOCK_S": "60"})
    procs.wait_idle("other")
    started = time.monotonic()
    task = real_queue.enqueue("sim.run", model="model-a", vram_gb=8, priority="P1", est_s=est(0.05))
    assert procs.redis.hget(real_queue.keys.task(task.id), "offered") == "holder"
    # woken by the pool-wide token, "other" leaves the task to the holder for P1's defer bound
    # (500 ms), as the lookout of its shape, then takes it
    record = procs.wait_state(task.id, State.SUCCEEDED, timeout=20)
    assert record.worker == "other"
    assert time.monotonic() - started < 10  # its lookout's time, not its idle minute
