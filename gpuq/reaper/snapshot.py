"""The pool as the scale planner sees it (``gpuq.reaper.scale_plan.plan``): live workers,
queue backlogs, GPU classes, holders, load times and forecasts, read by ``gpuq.reaper.scale``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuq.reaper.forecast import Forecast


@dataclass(frozen=True)
class WorkerState:
    """A live worker that takes work, as the planner sees it."""

    id: str
    gpu: str
    usable_gb: float  # total - KV reserve
    levels: str = "0123"  # priorities served
    idle_gb: float | None = None  # claimable GB while it has a free slot (in ``idle``)
    reserved: bool = False  # the preemption planner holds it for a queued task
    gpus: int = 1  # devices in its group
    # the models an idle one's claims skip now (its `lanes` entry: gpuq.worker.broken): it
    # takes none of their tasks and passes their preload hints over
    skips: frozenset[str] = frozenset()

    def serves(self, priority: int) -> bool:
        return str(priority) in (self.levels or "0123")


@dataclass(frozen=True)
class Backlog:
    """One (priority, model) queue: depth, head start-by, and a sample of its first tasks."""

    priority: int
    model: str
    depth: int
    head_ms: float
    sample: tuple[tuple[float, float, int], ...] = ()  # (vram_gb, est_s, gpus)


@dataclass(frozen=True)
class Snapshot:
    workers: tuple[WorkerState, ...] = ()
    backlogs: tuple[Backlog, ...] = ()
    classes: Mapping[str, float] = field(default_factory=dict)  # GPU class -> usable GB
    holders: Mapping[str, frozenset[str]] = field(default_factory=dict)  # model -> worker ids
    load_s: Mapping[str, float] = field(default_factory=dict)  # model -> mean load seconds
    footprint_gb: Mapping[str, float] = field(default_factory=dict)  # model -> weights GB
    # (bound GB, queued tasks whose need lies in (previous bound, bound]): bounds ascend, the
    # last is inf, and every class size and live worker size is one, so a band either fits a
    # live worker or does not, and the smallest class >= its bound is its smallest fit.
    need_bands: tuple[tuple[float, int], ...] = ()  # one-GPU tasks
    largest_need_gb: float = 0.0
    # handler -> sampled queued tasks that name it while no live worker's app registers it
    unregistered: Mapping[str, int] = field(default_factory=dict)
    forecasts: Mapping[str, Forecast] = field(default_factory=dict)  # model -> its forecast
    est_s: Mapping[str, float] = field(default_factory=dict)  # model -> mean est_s seen before
    # the models whose holders were read (None: every one with a forecast): only they may be
    # warmed ahead or signalled as rising, since holders unread look like none
    weighed: frozenset[str] | None = None
    class_gpus: Mapping[str, int] = field(default_factory=dict)  # GPU class -> GPUs (absent: 1)
    # (vram_gb, gpus) of queued tasks across several GPUs (a sample: backlog_sample.WIDE_SAMPLE)
    wide: tuple[tuple[float, int], ...] = ()
    # model -> the most GPUs a sampled task of it asked (kept across steps like est_s): a
    # forecast warm hint goes only to a worker with that many
    gpus_seen: Mapping[str, int] = field(default_factory=dict)
    # model -> the most VRAM a sampled task of it asked (kept the same way): with gpus_seen,
    # the shape a model without queued work is sized by in the class forecast
    need_seen: Mapping[str, float] = field(default_factory=dict)


def gpus_sampled(snap: Snapshot) -> dict[str, int]:
    """Per model, the most GPUs a task of its queues' samples asks this step."""
    out: dict[str, int] = {}
    for b in snap.backlogs:
        for *_, gpus in b.sample:
            out[b.model] = max(out.get(b.model, 1), gpus)
    return out


def need_sampled(snap: Snapshot) -> dict[str, float]:
    """Per model, the most VRAM a task of its queues' samples asks this step."""
    out: dict[str, float] = {}
    for b in snap.backlogs:
        for vram, *_ in b.sample:
            out[b.model] = max(out.get(b.model, 0.0), vram)
    return out
