"""The demo report's arithmetic: percentiles, busy time, SLA rows, URL redaction."""

from __future__ import annotations

from gpuq.config import Config
from gpuq.redact import redact
from gpuq.report import busy_seconds, percentile, priority_rows
from gpuq.task import TaskRecord


def record(priority: int, wait_s: float, state: str = "succeeded") -> TaskRecord:
    """A task claimed at once whose handler started wait_s after its enqueue (a model load)."""
    return TaskRecord.from_fields({
        "id": f"t{priority}{wait_s}", "handler": "sim.run", "model": "m", "vram_gb": "1",
        "priority": str(priority), "state": state, "enqueued_at": "1000",
        "started_at": "1000", "finished_at": "5000"})


def began(*records: TaskRecord, never: tuple[str, ...] = ()) -> dict[str, float]:
    """When each handler started: the wait its id names (tP<wait>), except the ids in never."""
    return {r.id: r.enqueued_at + float(r.id[2:]) for r in records if r.id not in never}


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


def test_priority_rows_measure_sla_at_handler_start_and_leave_p3_without_one() -> None:
    records = [record(0, 0.1), record(0, 0.3), record(3, 9.0)]
    p0, p1, _, p3 = priority_rows(records, Config(), began(*records))
    # each was claimed at once: the 0.3 s one missed P0's 200 ms SLA by its model load
    assert (p0["tasks"], p0["within_sla_at_start"], p0["p50_start_ms"]) == (2, 0.5, 300.0)
    assert p1["tasks"] == 0 and p1["within_sla_at_start"] is None and p1["p50_start_ms"] is None
    assert p3["sla_s"] is None and p3["within_sla_at_start"] is None and p3["p99_start_ms"] == 9000.0


def test_a_task_whose_handler_never_started_missed_its_sla() -> None:
    records = [record(0, 0.1), record(0, 0.15, state="failed")]
    (p0, *_) = priority_rows(records, Config(), began(*records, never=(records[1].id,)))
    assert (p0["tasks"], p0["within_sla_at_start"], p0["p99_start_ms"]) == (2, 0.5, 100.0)


def test_redact_hides_only_the_password() -> None:
    assert redact("redis://:s3cret@host:6380/0") == "redis://:***@host:6380/0"
    assert redact("rediss://user:pw@host/1") == "rediss://user:***@host/1"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
