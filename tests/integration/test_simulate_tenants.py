"""Replays with tenants: the reaper's room for recent demand (gpuq.reaper.tenant_room) runs in
the replay's rounds, and skipping quiet rounds does not change what it decides."""

from __future__ import annotations

import random
import statistics
from typing import Any

import pytest

from gpuq.config import Config
from gpuq.embedded import EmbeddedServer
from gpuq.sim.model import TraceTask
from gpuq.sim.policies import GpuqScheduler
from gpuq.sim.report import summarize
from gpuq.sim.run import parse_gpus, simulate
from gpuq.tenants import Tenant

TENANTS = (Tenant("a"), Tenant("b"))


def flood(seed: int = 1, span_s: float = 300.0) -> list[TraceTask]:
    """A floods P1 at ten times B's rate on 4 GPUs (more than they run); then a quiet gap, and
    B alone again, so rounds can be skipped once A's room has decayed."""
    rng, out = random.Random(seed), []
    for tenant, rate in (("a", 1.5), ("b", 0.15)):
        t = rng.expovariate(rate)
        while t < span_s:
            out.append(TraceTask(t, "m", 20.0, 1, rng.expovariate(1 / 4.0), 4.0, None, False,
                                 tenant=tenant))
            t += rng.expovariate(rate)
    out += [TraceTask(span_s + 2000 + 10 * i, "m", 20.0, 1, 4.0, 4.0, None, False, tenant="b")
            for i in range(5)]
    return sorted(out, key=lambda t: t.arrival_s)


def replay(server: EmbeddedServer, config: Config, skip: bool = True) -> Any:
    return simulate(flood(), parse_gpus("4x80"), "gpuq", speedup=1.0, load_time=lambda _m, _r: 5.0,
                    config=config, server=server, tenants=TENANTS, skip_ahead=skip)


def b_wait(result: Any) -> float:
    return statistics.mean(t.exec_s - t.arrival_s for t in result.tasks if t.tenant == "b")


def test_room_for_the_light_tenant_shortens_its_waits(redis_server: EmbeddedServer) -> None:
    config = Config(tenant_half_life_s=20)
    roomy, weights_only = replay(redis_server, config), replay(redis_server, Config(tenant_half_life_s=20,
                                                                                   tenant_headroom=0))
    assert b_wait(roomy) < b_wait(weights_only) / 1.5, (b_wait(roomy), b_wait(weights_only))


def test_skipping_quiet_rounds_gives_the_same_replay_with_tenants(
        redis_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = {"n": 0}
    original = GpuqScheduler.tick

    def counted(*args: Any, **kwargs: Any) -> Any:
        ticks["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(GpuqScheduler, "tick", counted)
    out = []
    for skip in (False, True):
        ticks["n"] = 0
        r = replay(redis_server, Config(tenant_half_life_s=20), skip)
        out.append(({k: v for k, v in summarize(r).items() if k != "wall_s"},
                    [(t.id, t.exec_s, t.end_s, t.worker) for t in r.tasks], ticks["n"]))
    (every, every_tasks, every_ticks), (skipped, skipped_tasks, skipped_ticks) = out
    assert skipped == every and skipped_tasks == every_tasks
    assert skipped_ticks < every_ticks  # the quiet gap's rounds, once nobody was bound


def test_a_replay_whose_last_tasks_can_never_run_ends(redis_server: EmbeddedServer) -> None:
    """Regression: with tenants registered, tasks that could never run (a tenant capped at 0
    GPUs) kept the reaper's rounds coming for ever and the replay never ended. Enqueue now
    refuses them, so the replay refuses them up front, as it does a task no GPU holds."""
    tasks = [TraceTask(0.0, "m", 8.0, 0, 1.0, 1.0, None, False, tenant="shop"),
             TraceTask(1.0, "m", 8.0, 0, 1.0, 1.0, None, False, tenant="ads")]
    result = simulate(tasks, parse_gpus("1x80"), "gpuq", speedup=1.0, load_time=lambda _m, _r: 1.0,
                      config=Config(), server=redis_server, tenants=(Tenant("shop", max_gpus=0),))
    assert (summarize(result)["starved"], result.rejected) == (0, 1)
    assert [t.tenant for t in result.tasks if t.exec_s is not None] == ["ads"]
