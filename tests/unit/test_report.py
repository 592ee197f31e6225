"""The demo report's arithmetic: percentiles, busy time, SLA rows, URL redaction."""

from __future__ import annotations

from gpuq.config import Config
from gpuq.redact import redact
from gpuq.report import busy_seconds, percentile, priority_rows
from gpuq.task import TaskRecord


def record(priority: int, wait_s: float, state: str = "succeeded") -> TaskRecord:
    return TaskRecord.from_fields({
        "id": f"t{priority}{wait_s}", "handler": "sim.run", "model": "m", "vram_gb": "1",
        "priority": str(priority), "state": state, "enqueued_at": "1000",
        "started_at": str(1000 + int(wait_s * 1000)), "finished_at": "5000"})


def test_percentile_takes_the_element_at_floor_q_n() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    assert percentile(values, 0.50) == 51  # index 50 of the sorted values
    assert percentile(values, 0.99) == 100
    assert percentile(values[1:], 0.99) == 99  # 99 values: int(98.01), the last
    assert percentile(values, 1.0) == 100
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([], 0.50) is None


def test_busy_seconds_merges_overlaps() -> None:
    assert busy_seconds([(0, 1), (0.5, 2), (3, 4), (3.2, 3.5)]) == 3.0
    assert busy_seconds([]) == 0.0


def test_priority_rows_measure_sla_and_leave_p3_without_one() -> None:
    rows = priority_rows([record(0, 0.1), record(0, 0.3), record(3, 9.0)], Config())
    p0, p1, _, p3 = rows
    assert (p0["tasks"], p0["sla_attained"], p0["p50_wait_ms"]) == (2, 0.5, 300.0)
    assert p1["tasks"] == 0 and p1["sla_attained"] is None and p1["p50_wait_ms"] is None
    assert p3["sla_s"] is None and p3["sla_attained"] is None and p3["p99_wait_ms"] == 9000.0


def test_redact_hides_only_the_password() -> None:
    assert redact("redis://:s3cret@host:6380/0") == "redis://:***@host:6380/0"
    assert redact("rediss://user:pw@host/1") == "rediss://user:***@host/1"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
