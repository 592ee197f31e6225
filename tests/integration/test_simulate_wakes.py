"""Which idle GPUs a replay's wake tokens reach (gpuq.sim.policies.GpuqScheduler.woken): as a
real worker pops them, a GPU takes its levels' tokens and the pool's, never another level's."""

from __future__ import annotations

import pytest

from gpuq.claims import ClaimRequest
from gpuq.connection import connect
from gpuq.embedded import EmbeddedServer
from gpuq.sim.engine import EPOCH_MS
from gpuq.sim.model import TraceTask
from gpuq.sim.policies import GpuqScheduler, Offer
from gpuq.sim.run import sim_config


def idle_pool(server: EmbeddedServer, gpus: dict[str, str]) -> GpuqScheduler:
    """GPUs (id -> levels served) join an empty pool and claim once: they idle."""
    client = connect(server.url)
    client.flushdb()
    scheduler = GpuqScheduler(client, sim_config())
    scheduler.register([(gpu, 80.0, levels, 1) for gpu, levels in gpus.items()], EPOCH_MS)
    for gpu, levels in gpus.items():
        req = ClaimRequest(gpu, 75.0, 0.0, 1, [], levels, 1, [])
        assert not isinstance(scheduler.claim(gpu, req, EPOCH_MS), Offer)
    return scheduler


@pytest.mark.parametrize(("priority", "woken"), [(2, {"gpu"}), (0, {"gpu", "lane"})])
def test_the_safety_token_reaches_only_gpus_serving_the_tasks_priority(
        redis_server: EmbeddedServer, priority: int, woken: set[str]) -> None:
    """The task is offered to the GPU it fits first ("gpu", by name); its safety token, on
    the list of its priority, is popped by the other idle GPU only if that one serves it (a
    P0 lane does not wake for batch work)."""
    scheduler = idle_pool(redis_server, {"gpu": "0123", "lane": "0"})
    scheduler.submit("t1", TraceTask(0.0, "m", 20.0, priority, 5.0, 5.0), EPOCH_MS + 1)
    assert scheduler.redis.hget(scheduler.keys.task("t1"), "offered") == "gpu"
    assert set(scheduler.woken(2, lambda: ["gpu", "lane"])) == woken


def test_batch_work_leaves_its_token_for_a_gpu_that_serves_it(redis_server: EmbeddedServer) -> None:
    scheduler = idle_pool(redis_server, {"lane": "0"})
    scheduler.submit("t1", TraceTask(0.0, "m", 20.0, 2, 5.0, 5.0), EPOCH_MS + 1)
    assert scheduler.woken(1, lambda: ["lane"]) == {}
    assert scheduler.redis.llen(scheduler.keys.level_wake(2)) == 1
