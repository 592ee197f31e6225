"""The worker's per-task metrics (gpuq.worker.observer)."""

from __future__ import annotations

from gpuq.metrics import WorkerMetrics
from gpuq.worker.observer import Observer


def latency_sum(metrics: WorkerMetrics, priority: str) -> float | None:
    return metrics.registry.get_sample_value("gpuq_schedule_latency_seconds_sum",
                                             {"pool": "p", "priority": priority})


def test_schedule_latency_counts_from_the_due_time_as_the_sla_does() -> None:
    """Regression: a task enqueued with a 5 s delay and started 0.09 s after it was due
    showed 5.09 s in the histogram (past the 1 s P1 SLA) while the SLA counters said met."""
    observer = Observer()
    observer.metrics = metrics = WorkerMetrics("p", "w", "A100")
    common = {"queued_at": "10000", "enqueued_at": "5000", "sla": "met"}
    observer.started({"id": "delayed", "priority": "1", "started_at": "10090", "due_at": "10000",
                      **common})
    assert latency_sum(metrics, "P1") == 0.09
    observer.started({"id": "plain", "priority": "2", "started_at": "5200", "due_at": "", **common})
    assert latency_sum(metrics, "P2") == 0.2
    cold = {"id": "cold", "priority": "0", "started_at": "10000", "due_at": "10000",
            **common, "sla": "pending"}
    observer.started(cold)
    observer.began(cold, 10_150)
    assert latency_sum(metrics, "P0") == 0.15
