"""Replays whose tasks expire end: an expiry takes the task off the waiting counts the
simulator's rounds and autoscaler go by, whichever script expired it (found by a capacity
planner replaying a CSV of their own with a deadline column: both replays below ran for good)."""

from __future__ import annotations

import pytest

from gpuq.embedded import EmbeddedServer
from gpuq.sim.autoscale import Autoscale
from gpuq.sim.model import TraceTask
from gpuq.sim.report import summarize
from gpuq.sim.run import parse_gpus, simulate


@pytest.mark.timeout(60)
def test_a_task_its_yield_expires_ends_the_replay(redis_server: EmbeddedServer) -> None:
    """A P3 task asked to yield for a P0 one can no longer meet its deadline: its requeue
    ends it expired (requeue.lua), and the replay counted it queued again, so the reaper's
    rounds came every virtual second until the workers' ten-year leases, and after."""
    tasks = [TraceTask(0.0, "a", 8.0, 3, 20.0, 20.0, 24.0),
             TraceTask(5.0, "b", 8.0, 0, 5.0, 5.0)]
    result = simulate(tasks, parse_gpus("1x80"), "gpuq", speedup=1.0, load_time=lambda _m, _r: 1.0,
                      server=redis_server)
    report = summarize(result)
    assert report["priorities"]["P3"]["expired"] == 1 and report["succeeded"] == 1
    assert result.makespan_s < 60


@pytest.mark.timeout(60)
def test_a_task_the_reaper_expires_ends_an_autoscaled_replay(redis_server: EmbeddedServer) -> None:
    """The autoscaler ticks while tasks wait: a task the reaper expired stayed counted as
    waiting, so its ticks never stopped."""
    tasks = [TraceTask(0.0, "a", 8.0, 1, 100.0, 100.0),
             TraceTask(1.0, "b", 8.0, 3, 1.0, 1.0, 10.0)]
    result = simulate(tasks, [], "gpuq", speedup=1.0, load_time=lambda _m, _r: 1.0, server=redis_server,
                      autoscale=Autoscale(1, 1, 80.0))
    report = summarize(result)
    assert report["priorities"]["P3"]["expired"] == 1 and report["succeeded"] == 1
