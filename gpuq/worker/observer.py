"""A worker's per-task metrics: what it records when a task starts, ends a phase, settles.

Off unless the worker serves metrics (``--metrics-port``); then each running task's
priority label is kept from its start until it settles (labels never carry a task id).
"""

from __future__ import annotations

from gpuq.metrics import WorkerMetrics


def origin(fields: dict[str, str]) -> int:
    """Where a task's schedule latency starts, as its SLA's: when it was due (a delayed task,
    a child released by its parents), else its enqueue."""
    return int(fields.get("due_at") or fields["enqueued_at"])


class Observer:
    def __init__(self) -> None:
        self.metrics: WorkerMetrics | None = None
        self._labels: dict[str, str] = {}  # task id -> priority label until the task settles

    def started(self, fields: dict[str, str]) -> None:
        """A task is claimed or handed over: its queue phase; and its schedule latency when
        this start decided its SLA (sla "met" or "missed": its model was held, so the
        handler starts at once; a cold start's comes with ``began``)."""
        if self.metrics is None:
            return
        label = f"P{fields['priority']}"
        self._labels[fields["id"]] = label
        started = int(fields["started_at"])
        self.metrics.queued(label, (started - int(fields["queued_at"])) / 1000)
        if fields.get("sla") in ("met", "missed"):
            self.metrics.first_start(label, (started - origin(fields)) / 1000)

    def load_failed(self, model: str) -> None:
        """A model's loader raised on this worker (gpuq.worker.broken)."""
        if self.metrics is not None:
            self.metrics.load_failed(model)

    def began(self, fields: dict[str, str], now_ms: int) -> None:
        """A cold-started task's handler starts (began.lua decided its SLA at now_ms)."""
        if self.metrics is None or fields["id"] not in self._labels:
            return
        self.metrics.first_start(self._labels[fields["id"]], (now_ms - origin(fields)) / 1000)

    def observe(self, task_id: str, outcome: str | None = None, phase: str = "",
                seconds: float = 0.0, *, keep: bool = False) -> None:
        """Record a task's phase time or its outcome (the last word on it) when metrics are on;
        ``keep``: the label stays, for a later run of the task on this worker that holds it."""
        if self.metrics is None or task_id not in self._labels:
            return
        if phase:
            self.metrics.phase_done(self._labels[task_id], phase, seconds)
        if outcome:
            label = self._labels[task_id] if keep else self._labels.pop(task_id)
            self.metrics.settled(label, outcome)
