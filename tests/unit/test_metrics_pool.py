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


def test_tenants_export_their_queue_bound_use_and_quota() -> None:
    sla = {p: {"met": 0, "missed": 0} for p in PRIORITIES}
    flooder = {"name": "a", "queued": {"P1": 40}, "bound": 5, "running": 5, "running_gpus": 5,
               "running_vram_gb": 100.0,
               "max_gpus": None, "max_vram_gb": None, "sla": sla}
    # one task across two GPUs: the GPU cap's use counts both
    capped = {"name": "b", "queued": {}, "bound": None, "running": 1, "running_gpus": 2,
              "running_vram_gb": 20.0, "max_gpus": 4, "max_vram_gb": None, "sla": sla}
    light = {"name": "c", "queued": {}, "bound": None, "running": None, "running_gpus": None,
             "running_vram_gb": None,
             "max_gpus": None, "max_vram_gb": None, "sla": sla}
    registry = CollectorRegistry()
    registry.register(PoolCollector(lambda: PoolFigures(pool="p", tenants=[flooder, capped, light])))
    got = {(f.name, s.labels["tenant"], s.labels.get("resource", "")): s.value
           for f in registry.collect() if f.name.startswith("gpuq_tenant_") and f.type == "gauge"
           for s in f.samples if s.labels.get("priority") in (None, "P1")}
    assert got == {("gpuq_tenant_queued", "a", ""): 40, ("gpuq_tenant_queued", "b", ""): 0,
                   ("gpuq_tenant_queued", "c", ""): 0, ("gpuq_tenant_bound", "a", ""): 5,
                   ("gpuq_tenant_running", "a", ""): 5, ("gpuq_tenant_running", "b", ""): 1,
                   ("gpuq_tenant_running_gpus", "a", ""): 5, ("gpuq_tenant_running_gpus", "b", ""): 2,
                   ("gpuq_tenant_running_vram_gb", "a", ""): 100.0,
                   ("gpuq_tenant_running_vram_gb", "b", ""): 20.0,
                   ("gpuq_tenant_quota_use_ratio", "b", "gpus"): 0.5}


def test_corrupt_tasks_without_a_priority_are_counted_once_there_is_one() -> None:
    """Regression: stats ``failed:unleveled`` was not exported, so corrupt tasks were missing
    from the failure-rate alert."""
    def tasks_total(stats: dict[str, float]) -> dict[tuple[str, str], float]:
        registry = CollectorRegistry()
        registry.register(PoolCollector(lambda: PoolFigures(pool="p", stats=stats)))
        return {(s.labels["priority"], s.labels["outcome"]): s.value for family in registry.collect()
                if family.name == "gpuq_tasks" for s in family.samples if s.name == "gpuq_tasks_total"}

    assert not any(p == "unleveled" for p, _ in tasks_total({}))
    assert tasks_total({"failed:unleveled": 2, "failed:P1": 1})[("unleveled", "failed")] == 2
