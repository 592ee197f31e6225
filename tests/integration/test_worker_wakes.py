"""The wake lists a real worker process waits on (lib/wake.lua), against real Redis."""

from __future__ import annotations

import time

import pytest
from procs import Procs, est

from gpuq import Queue, State

pytestmark = pytest.mark.slow


def script_calls(procs: Procs) -> int:
    return int(procs.redis.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))


def test_an_idle_online_lane_is_not_woken_by_batch_work(procs: Procs, real_queue: Queue) -> None:
    """Batch work no idle worker serves wakes on P2's list, which an online lane does not
    wait on: the lane does not claim once a task for nothing (it did, woken by the pool's
    list: 40 script calls for 20 enqueues). Online work still reaches it."""
    procs.worker("lane", env={"GPUQ_PRIORITIES": "P0"})
    procs.wait_idle("lane")
    before = script_calls(procs)
    for _ in range(20):
        real_queue.enqueue("sim.run", model="model-a", vram_gb=8, priority="P2", est_s=est(0.01))
        time.sleep(0.01)
    time.sleep(0.5)
    assert script_calls(procs) - before < 25  # the enqueues, and a heartbeat or two
    assert real_queue.redis.llen(real_queue.keys.level_wake(2)) == 16  # for a worker serving P2
    online = real_queue.enqueue("sim.run", model="model-a", vram_gb=8, priority="P0", est_s=est(0.01))
    assert procs.wait_state(online.id, State.SUCCEEDED, timeout=30).worker == "lane"
