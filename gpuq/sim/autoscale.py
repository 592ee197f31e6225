"""An autoscaler in a replay (gpuq only): GPUs of one class come and go on the virtual clock.

The pool starts with ``min`` GPUs. Every ``every_s`` the reaper's scaler runs
(``gpuq.reaper.scale.Scaler.step``, the production planner: reactive, or with the
forecast, per ``scale_signal``) and the autoscaler reads the class's desired count, as an
autoscaler polling the ``scale`` hash would: when desired exceeds the live GPUs plus those
booting, it boots more (up to ``max``), each joining the pool ``boot_s`` later with nothing
loaded (its first task loads its model as usual). The step's warm hints reach the GPUs at
once (``Engine.deliver``), as a worker's control list would. A GPU idle for ``idle_s`` leaves while
more than ``min`` are live, as a worker retires itself (``idle_timeout_s``). GPU time is
counted from a boot's start (a provider bills from then) to the GPU's departure, or to the
replay's last task end.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpuq.errors import ConfigError
from gpuq.sim.model import TraceTask
from gpuq.sim.policies import GpuqScheduler, Scheduler


class Gpu(Protocol):
    """A simulated GPU, as the autoscaler sees it."""

    id: str
    busy: list[tuple[float, float]]  # (claimed, stopped) of each run
    joined_s: float

    @property
    def idle(self) -> bool: ...


class Pool(Protocol):
    """What the autoscaler needs of the engine: its clock, its GPUs, and adding and removing one."""

    scheduler: Scheduler
    now: float
    arrivals_left: int

    @property
    def live(self) -> Sequence[Gpu]: ...

    def at(self, t: float, kind: str, key: str = "", gen: int = 0,
           queued: float | None = None) -> None: ...

    def ms(self, t: float | None = None) -> int: ...

    def running(self) -> Iterator[TraceTask]: ...

    def waiting(self) -> int: ...

    def add_worker(self, wid: str, gb: float) -> None: ...

    def retire(self, wid: str) -> None: ...

    def deliver(self) -> None: ...


@dataclass(frozen=True)
class Autoscale:
    min: int
    max: int
    gb: float  # the GPUs' VRAM
    boot_s: float = 60.0
    idle_s: float = 300.0
    every_s: float = 15.0

    @classmethod
    def parse(cls, spec: str, gb: float, **settings: Any) -> Autoscale:
        """"MIN:MAX" (e.g. "1:8")."""
        m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", spec)
        if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
            raise ConfigError(f"--autoscale {spec!r}: use MIN:MAX with 1 <= MIN <= MAX, e.g. 1:8")
        out = cls(int(m.group(1)), int(m.group(2)), gb, **settings)
        if out.boot_s < 0 or out.idle_s < 0 or out.every_s <= 0:
            raise ConfigError("--boot-s and --idle-s must be >= 0, --scale-every-s > 0")
        return out

    @property
    def gpu_class(self) -> str:
        return f"sim-{self.gb:g}GB"  # the name the simulated GPUs register with

    def gpu_id(self, n: int) -> str:
        return f"gpu{self.gb:g}-{n}"


class Autoscaler:
    def __init__(self, engine: Pool, spec: Autoscale) -> None:
        self.engine = engine
        self.spec = spec
        self.booting: set[str] = set()
        self.made = 0  # GPUs ever started (ids are numbered in order)
        self.boots = self.retired = self.peak = 0
        self.up_s: dict[str, float] = {}  # GPU -> when its boot started
        self.down_s: dict[str, float] = {}  # GPU -> when it left

    def initial(self) -> list[tuple[str, float]]:
        """The starting pool: ``min`` GPUs, up from time 0."""
        ids = [self.spec.gpu_id(i) for i in range(self.spec.min)]
        self.made = self.peak = len(ids)
        self.up_s.update((i, 0.0) for i in ids)
        return [(i, self.spec.gb) for i in ids]

    def start(self) -> None:
        self.engine.at(self.spec.every_s, "scale")

    def tick(self) -> None:
        """The scaler's step, then boots and retirements; the next tick unless the replay is
        over (no arrival left, nothing queued or running, no boot under way)."""
        e, spec = self.engine, self.spec
        assert isinstance(e.scheduler, GpuqScheduler)
        plan = e.scheduler.reaper.scaler.step(e.ms())
        e.deliver()  # its warm hints reach the idle GPUs at once, as a control list's pop would
        live = len(e.live)
        desired = next((s.desired for s in plan.signals
                        if s.kind == "class" and s.name == spec.gpu_class), live)
        for _ in range(min(desired, spec.max) - live - len(self.booting)):
            wid = spec.gpu_id(self.made)
            self.made += 1
            self.boots += 1
            self.booting.add(wid)
            self.up_s[wid] = e.now
            e.at(e.now + spec.boot_s, "boot", wid)
        idle = sorted((w for w in e.live if w.idle and e.now - self.idle_since(w) >= spec.idle_s),
                      key=lambda w: (self.idle_since(w), w.id))
        for w in idle:
            if len(e.live) <= spec.min:
                break
            e.retire(w.id)
            self.retired += 1
            self.down_s[w.id] = e.now
        if e.arrivals_left or self.booting or e.waiting() or any(True for _ in e.running()):
            e.at(e.now + spec.every_s, "scale")

    @staticmethod
    def idle_since(w: Gpu) -> float:
        return max(w.busy[-1][1] if w.busy else 0.0, w.joined_s)

    def boot(self, wid: str) -> None:
        self.booting.discard(wid)
        self.engine.add_worker(wid, self.spec.gb)
        self.peak = max(self.peak, len(self.engine.live))

    def figures(self, end_s: float) -> dict[str, Any]:
        """GPU time and the fleet's moves, for the report."""
        gpu_s = sum(max(0.0, self.down_s.get(w, end_s) - up) for w, up in self.up_s.items()
                    if up <= end_s)
        return {"min": self.spec.min, "max": self.spec.max, "boot_s": self.spec.boot_s,
                "idle_s": self.spec.idle_s, "every_s": self.spec.every_s,
                "gpu_hours": round(gpu_s / 3600, 3), "boots": self.boots, "retired": self.retired,
                "peak_gpus": self.peak, "mean_gpus": round(gpu_s / end_s, 3) if end_s > 0 else 0.0}
