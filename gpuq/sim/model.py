"""The simulator's records: what a trace asks for, and what happened to each task.

Shared by the trace readers (``gpuq.sim.traces``), the engine (``gpuq.sim.engine``) and the
report (``gpuq.sim.report``). Times are virtual seconds since the replay's start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpuq.config import Config


@dataclass(frozen=True)
class TraceTask:
    """One request of a trace, as the scheduler will see it."""

    arrival_s: float  # after time compression (the engine applies --speedup)
    model: str
    vram_gb: float  # the task's whole need, weights included
    priority: int  # 0..3
    service_s: float  # how long it really runs on the GPU once its model is loaded
    est_s: float  # what the producer declares (the scheduler sees only this)
    deadline_s: float | None = None  # relative to arrival
    preemptible: bool = True
    tenant: str = "default"
    gpus: int = 1  # devices it runs across (a 70B model on two 80 GB GPUs: 2)


def devices_of(worker_id: str) -> int:
    """GPUs in a simulated worker's group: its id says so ("gpu4x80-0"; "gpu80-0": one)."""
    m = re.match(r"gpu(\d+)x", worker_id)
    return int(m.group(1)) if m else 1


@dataclass
class SimTask:
    """What happened to one task in a run."""

    id: str
    priority: int
    model: str
    vram_gb: float
    arrival_s: float
    est_s: float
    service_s: float
    start_s: float | None = None  # first claim
    # when its handler first started, model loaded (the SLA's measure); None: it never did.
    # The attempt that counts is that one: an earlier one stopped during its load started
    # no handler
    exec_s: float | None = None
    load_wait_s: float = 0.0  # that attempt's claim to handler start: its model's load
    cold_start: bool = False  # that attempt loaded its model
    end_s: float | None = None
    worker: str | None = None
    outcome: str = "unfinished"  # succeeded | expired | failed | canceled | unfinished
    preemptions: int = 0
    tenant: str = "default"


@dataclass
class SimResult:
    policy: str
    speedup: float
    gpus: list[tuple[str, float]]  # (worker id, VRAM GB)
    sla_s: list[float | None]  # per priority; None: no SLA (P3)
    tasks: list[SimTask]
    busy_s: dict[str, float] = field(default_factory=dict)  # per worker: seconds loading or running
    loading_s: dict[str, float] = field(default_factory=dict)  # per worker: of busy_s, loading
    busy_intervals: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    model_loads: int = 0
    preemptions: dict[str, int] = field(default_factory=dict)  # kind -> count
    makespan_s: float = 0.0  # first arrival to last end
    wall_s: float = 0.0  # real seconds the replay took
    claims: list[str] = field(default_factory=list)  # task ids in claim order (fidelity checks)
    rejected: int = 0  # larger than every GPU, a deadline under their est_s, past caps: refused up front
    kv_reserve_gb: float = field(default_factory=lambda: Config().kv_reserve_gb)  # per GPU
    # with an autoscaler (gpuq.sim.autoscale): GPU hours, boots, retirements; None: a fixed pool
    autoscale: dict[str, Any] | None = None
