"""Pool metrics as the exporter serves them (gpuq.metrics.PoolCollector), no Redis needed."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gpuq.metrics import PRIORITIES, PoolCollector, PoolFigures


def depths(figures: PoolFigures) -> dict[tuple[str, str], float]:
    registry = CollectorRegistry()
    registry.register(PoolCollector(lambda: figures))
    return {(s.labels["priority"], s.labels["model"]): s.value for family in registry.collect()
            if family.name == "gpuq_queue_depth" for s in family.samples}


def test_an_empty_pool_exports_a_zero_depth_per_priority() -> None:
    assert depths(PoolFigures(pool="p")) == {(p, ""): 0 for p in PRIORITIES}


def test_a_priority_with_queued_work_has_only_its_models_series() -> None:
    got = depths(PoolFigures(pool="p", queues=[("P1", "llama", 3, 0.5), ("P1", "mistral", 1, 0.1)]))
    assert got == {("P0", ""): 0, ("P1", "llama"): 3, ("P1", "mistral"): 1, ("P2", ""): 0, ("P3", ""): 0}
