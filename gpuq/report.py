"""Summaries of a finished run for ``gpuq demo`` (and benchmarks): waits, SLAs, GPUs, loads.

Everything is computed from the task records the scripts wrote (server-clock timestamps, so
producer and workers agree) plus the pool's model catalog; nothing is estimated. A task's wait
runs from its enqueue to its handler's first start with its model loaded (``began_at``), not
to its claim: a task claimed at once that then loads its model for 20 s waited 20 s.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from gpuq.catalog import ModelEntry
from gpuq.config import Config
from gpuq.keys import Keys
from gpuq.task import Priority, State, TaskRecord

FETCH_CHUNK = 500  # HGETALLs per pipeline round trip


@dataclass(frozen=True)
class Gpu:
    name: str  # also the worker id, so records and logs map straight to a GPU
    vram_gb: float  # each device's
    slots: int
    count: int = 1  # devices in the worker's group (one tensor-parallel server)

    @property
    def size(self) -> str:
        return f"{self.vram_gb:g}GB" if self.count == 1 else f"{self.count}x{self.vram_gb:g}GB"


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0 <= q <= 1): the sorted values' element at index floor(q x n), the
    last for q = 1. No interpolation: every figure is a wait that happened."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fetch_records(client: redis.Redis, keys: Keys,
                  ids: Sequence[str]) -> tuple[dict[str, TaskRecord], dict[str, float]]:
    """Pipelined HGETALL of every task: the records (an id missing has no record), and when
    each task's handler first started (``began_at``, epoch s; none if it never started)."""
    out: dict[str, TaskRecord] = {}
    began: dict[str, float] = {}
    for i in range(0, len(ids), FETCH_CHUNK):
        pipe = client.pipeline(transaction=False)
        for task_id in ids[i:i + FETCH_CHUNK]:
            pipe.hgetall(keys.task(task_id))
        for fields in pipe.execute():
            if fields:
                record = TaskRecord.from_fields(fields)
                out[record.id] = record
                if fields.get("began_at"):
                    began[record.id] = int(fields["began_at"]) / 1000.0
    return out, began


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def priority_rows(records: Sequence[TaskRecord], config: Config,
                  began: dict[str, float]) -> list[dict[str, Any]]:
    """Per priority: waits from enqueue to the handler's first start (began: task id -> epoch
    s), and the share of all its tasks whose handler started within the SLA (one that never
    started missed it)."""
    sla = (config.sla_p0_s, config.sla_p1_s, config.sla_p2_s, None)  # P3 has no SLA
    rows = []
    for p in Priority:
        mine = [r for r in records if r.priority is p]
        waits = [began[r.id] - r.enqueued_at for r in mine if r.id in began]
        limit = sla[p]
        within = None if limit is None or not mine else sum(w <= limit for w in waits) / len(mine)
        timed = [r for r in mine if r.deadline is not None]
        met = sum(r.state is State.SUCCEEDED and r.finished_at is not None
                  and r.finished_at <= (r.deadline or 0) for r in timed)
        rows.append({"priority": p.label, "tasks": len(mine),
                     "p50_start_ms": _ms(percentile(waits, 0.50)),
                     "p99_start_ms": _ms(percentile(waits, 0.99)),
                     "sla_s": limit, "within_sla_at_start": within,
                     "with_deadline": len(timed), "deadline_met": met})
    return rows


def busy_seconds(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals: time a GPU ran at least one task."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def gpu_rows(records: Sequence[TaskRecord], gpus: Sequence[Gpu], loads: dict[str, int],
             span_s: float) -> list[dict[str, Any]]:
    """Per GPU: tasks it ended, and the share of the run it was busy (model loads included).

    Busy counts time with at least one task running, not slot-seconds: a second slot on a
    big card is headroom for online work beside batch, not a second GPU.
    """
    rows = []
    for gpu in gpus:
        spans = [(r.started_at, r.finished_at) for r in records
                 if r.worker == gpu.name and r.started_at and r.finished_at]
        busy = busy_seconds([(s, e) for s, e in spans if s is not None and e is not None])
        rows.append({"gpu": gpu.name, "vram_gb": gpu.vram_gb, "gpus": gpu.count, "size": gpu.size,
                     "slots": gpu.slots,
                     "tasks": len(spans), "busy": round(min(1.0, busy / span_s), 3),
                     "model_loads": loads.get(gpu.name, 0)})
    return rows


def summarize(records: Sequence[TaskRecord], began: dict[str, float], expected: int,
              config: Config, gpus: Sequence[Gpu], loads: dict[str, int],
              catalog: Sequence[ModelEntry]) -> dict[str, Any]:
    outcomes = Counter(r.state.value for r in records)
    ended = sum(n for s, n in outcomes.items() if State(s).terminal)
    # the run on the server's clock: first enqueue to last end
    ends = [r.finished_at for r in records if r.finished_at is not None]
    first = min((r.enqueued_at for r in records), default=0.0)
    span_s = max(ends, default=first) - first
    return {
        "tasks": expected,
        "span_s": round(span_s, 3),
        "not_ended": expected - ended,  # still queued or running, or no record at all
        "outcomes": {s.value: outcomes.get(s.value, 0) for s in State if outcomes.get(s.value)},
        "priorities": priority_rows(records, config, began),
        "gpus": gpu_rows(records, gpus, loads, max(span_s, 1e-3)),
        # tasks that asked for several GPUs, and the workers (groups) they ran on
        "multi_gpu": {"tasks": sum(1 for r in records if r.gpus > 1),
                      "workers": sorted({r.worker for r in records if r.gpus > 1 and r.worker})},
        "model_loads": sum(e.loads for e in catalog),
        "models": [{"model": e.name, "vram_gb": e.vram_gb, "loads": e.loads,
                    "mean_load_s": round(e.mean_load_s, 3)} for e in catalog],
    }


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def render(summary: dict[str, Any]) -> str:
    """The demo's report as text: header, tables, verdict (the same figures as its JSON)."""
    lines = [f"gpuq demo: {summary['tasks']} tasks in {summary['seconds']:g} s "
             f"({summary['rate_per_s']}/s, seed {summary['seed']}, time scale "
             f"{summary['time_scale']:g}) on {len(summary['gpus'])} simulated GPUs, "
             f"pool {summary['pool']} on {summary['redis']}", ""]
    # waits: enqueue to the handler's first start, model loaded (a cold load counts)
    lines += [f"{'PRIORITY':<9}{'TASKS':>6}{'P50 START':>11}{'P99 START':>11}{'SLA':>9}"
             f"{'WITHIN SLA AT START':>20}{'DEADLINE MET':>14}"]
    for row in summary["priorities"]:
        sla = "-" if row["sla_s"] is None else f"{row['sla_s']:g} s"
        deadline = f"{row['deadline_met']}/{row['with_deadline']}" if row["with_deadline"] else "-"
        lines.append(f"{row['priority']:<9}{row['tasks']:>6}{_cell(row['p50_start_ms'], '.0f'):>8} ms"
                     f"{_cell(row['p99_start_ms'], '.0f'):>8} ms{sla:>9}"
                     f"{_share(row['within_sla_at_start']):>20}{deadline:>14}")
    lines += ["", f"{'GPU':<16}{'VRAM':>7}{'SLOTS':>7}{'TASKS':>7}{'BUSY':>8}{'MODEL LOADS':>13}"]
    for row in summary["gpus"]:
        lines.append(f"{row['gpu']:<16}{row['size']:>7}{row['slots']:>7}{row['tasks']:>7}"
                     f"{_share(row['busy']):>8}{row['model_loads']:>13}")
    multi = summary["multi_gpu"]
    if multi["tasks"]:
        lines.append(f"multi-GPU tasks: {multi['tasks']}, run on {', '.join(multi['workers']) or 'none yet'}")
    models = ", ".join(f"{m['model']} {m['loads']} ({m['mean_load_s']:.2f} s)"
                       for m in summary["models"])
    lines += ["", f"model loads: {summary['model_loads']} in all: {models or 'none'}"]
    outcomes = ", ".join(f"{n} {state}" for state, n in summary["outcomes"].items())
    lines.append(f"outcomes: {outcomes or 'none'}; not ended: {summary['not_ended']}")
    for name, why in summary["failed_processes"].items():
        lines.append(f"FAILED: {name} {why}")
    if summary["not_ended"]:
        lines.append(f"FAILED: {summary['not_ended']} task(s) did not end within "
                     f"{summary['drain_cap_s']:g} s of the producer stopping")
    lines.append(f"worker logs: {summary['worker_logs']}")
    return "\n".join(lines)
