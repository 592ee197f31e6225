"""Starvation control with a real worker: under sustained P0 load, P3 keeps its share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import Procs, est

from gpuq import Queue, State
from gpuq.embedded import EmbeddedServer

pytestmark = pytest.mark.slow


@pytest.fixture
def procs(redis_server: EmbeddedServer, pool: str, prefix: str, tmp_path: Path) -> Iterator[Procs]:
    with Procs(redis_server.url, pool, prefix, tmp_path, GPUQ_FAIR_EVERY="3") as p:
        yield p


def test_p3_gets_one_dispatch_in_four_while_p0_saturates_the_worker(procs: Procs,
                                                                     real_queue: Queue) -> None:
    def batch(priority: str, n: int) -> list[str]:
        return [t.id for t in real_queue.enqueue_many(
            [{"handler": "sim.run", "payload": {}, "model": "m", "vram_gb": 10,
              "priority": priority, "est_s": est(0.01)} for _ in range(n)])]

    online, offline = batch("P0", 60), batch("P3", 20)
    procs.worker("w1", vram_gb=24)
    records = procs.wait_all(online + offline, State.SUCCEEDED, timeout=60)
    # fencing tokens grow with every claim: they give the dispatch order
    order = sorted(records, key=lambda r: r.token or 0)
    while_p0_queued = order[:60 + 60 // 3]  # the P0 backlog lasts this many dispatches
    p3_share = sum(r.priority == 3 for r in while_p0_queued) / len(while_p0_queued)
    assert p3_share == pytest.approx(1 / 4, abs=0.02)
    stats = procs.redis.hgetall(procs.keys.stats)
    assert int(stats["fair:P3"]) == 20  # every P3 went by the fairness rule
    assert all(r.priority == 3 for r in order[3::4][:20])  # P0, P0, P0, P3, ...
