"""The exporter's per-model series cap: the deepest queues (most loads, most workers desired)
keep their own series, the rest are summed as model "other", and nothing goes uncounted."""

from __future__ import annotations

import fakeredis
from prometheus_client import CollectorRegistry, generate_latest

from gpuq import Queue
from gpuq.config import Config
from gpuq.metrics import PoolCollector
from gpuq.views.exporter import OTHER, read_figures, top_loads


def test_the_most_loaded_models_keep_their_series() -> None:
    loads = [("b", 5, 50.0), ("a", 5, 40.0), ("c", 1, 9.0), ("d", 2, 20.0)]
    assert top_loads(loads, 2) == [("a", 5, 40.0), ("b", 5, 50.0), (OTHER, 3, 29.0)]
    assert top_loads(loads, 4) == sorted(loads, key=lambda m: (-m[1], m[0]))


def test_a_pool_of_many_models_exports_a_bounded_number_of_series() -> None:
    q = Queue(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"))
    q.enqueue_many([{"handler": "h", "model": f"m{i:03d}", "vram_gb": 1, "priority": "P2"}
                    for i in range(300) for _ in range(1 + i % 3)])
    figures = read_figures(q.redis, q.keys, keep=20)
    p2 = [row for row in figures.queues if row[0] == "P2"]
    assert len(p2) == 21 and p2[-1][1] == OTHER
    assert sum(row[2] for row in p2) == sum(1 + i % 3 for i in range(300))
    assert {row[2] for row in p2[:-1]} == {3}  # the deepest queues keep their own series
    assert p2[-1][3] >= max(row[3] for row in p2[:-1])  # other: its oldest head (enqueued first)
    registry = CollectorRegistry()
    registry.register(PoolCollector(lambda: figures))
    series = [line for line in generate_latest(registry).decode().splitlines()
              if line and not line.startswith("#")]
    assert len([s for s in series if s.startswith("gpuq_queue_depth{")]) == 21 + 3  # + empty levels
    assert len(series) < 200
