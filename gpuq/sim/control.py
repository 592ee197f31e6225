"""The simulated GPUs' control messages (gpuq only): what a worker's heartbeat thread pops
from its control list, taken as ``gpuq.worker`` takes it.

``yield <task> <grace_ms>`` (the reaper's preemption plan): honoured at once while the task
runs; during its model's load, at the load's end (a handler sees it only once it runs), or
the task is stopped at the grace. ``preload <model> <gb>`` (the scaler's warm hints): the
model's VRAM is reserved (idle models evicted for it) and it loads for its load time while
the GPU stays free to claim; the pool sees it held only once loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from gpuq.sim.policies import GpuqScheduler, Scheduler
from gpuq.worker.models import ModelCache, Reservation


class Gpu(Protocol):
    """A simulated GPU, as its control messages see it (``gpuq.sim.engine.SimWorker``)."""

    id: str
    cache: ModelCache
    run: Any  # the engine's Run, or None while idle
    generation: int
    gone: bool
    preloading: dict[str, tuple[float, float, Reservation]]


class Replay(Protocol):
    """What control messages need of the engine: its clock, its GPUs, a yield's effect."""

    scheduler: Scheduler
    now: float
    loads: int
    load_time: Callable[[str], float]
    steps: Any  # gpuq.sim.hints.Steps: told of loads

    @property
    def workers(self) -> Sequence[Any]: ...

    @property
    def by_id(self) -> Mapping[str, Any]: ...

    def at(self, t: float, kind: str, key: str = "", gen: int = 0,
           queued: float | None = None) -> None: ...

    def give_way(self, w: Any, how: str) -> None: ...

    def ms(self, t: float | None = None) -> int: ...


class Control:
    def __init__(self, engine: Replay) -> None:
        self.engine = engine

    @property
    def scheduler(self) -> GpuqScheduler:
        assert isinstance(self.engine.scheduler, GpuqScheduler)
        return self.engine.scheduler

    def deliver(self, running_only: bool = False) -> None:
        """The live workers' control messages, as their heartbeat threads pop them.
        running_only: a planner pass's yields, which go only to GPUs running their victims
        (popped at once, so a GPU at rest holds at most "unyield" notes, which it ignores):
        the other GPUs' lists are not read (a pipeline per GPU of a large pool)."""
        e = self.engine
        workers = [w.id for w in e.workers if w.run is not None or not running_only]
        for wid, messages in self.scheduler.control(workers).items():
            for message in messages:
                self.on_message(e.by_id[wid], message)

    def on_message(self, w: Gpu, message: str) -> None:
        e = self.engine
        verb, *args = message.split()
        if verb == "preload" and len(args) == 2:
            self.preload(w, args[0], float(args[1]))
            return
        if verb != "yield" or w.run is None or w.run.offer.task_id != args[0]:
            return
        if e.now < w.run.work_from:
            # still loading its model: a handler sees the request only once it runs, and the
            # worker stops the task if the grace passes first
            grace_s = int(args[1]) / 1000  # "yield <task> <grace_ms>" (preempt.lua)
            e.at(min(w.run.work_from, e.now + grace_s), "yield", w.id, w.generation)
            return
        e.give_way(w, "yielded")

    def began(self, w: Gpu, gen: int) -> None:
        """A cold start's load ended, unless the run was stopped first: the catalog records
        the load, and the worker reports its handler's start (began.lua)."""
        run = w.run
        if gen != w.generation or run is None:
            return
        if run.load:
            self.scheduler.recorded(run.load)
            self.engine.steps.loaded(run.load[0])
        if run.offer.cold:
            self.scheduler.began(run.offer, self.engine.ms())

    def preload(self, w: Gpu, model: str, vram_gb: float) -> None:
        """A warm hint: nothing if the GPU has the model or no room for it."""
        e = self.engine
        if model in w.cache.resident:
            return
        res = w.cache.reserve(model, vram_gb)
        if res is None:
            return  # no room: the worker skips it
        for old in res.evict:  # a simulated unload takes no time
            w.cache.unload(old)
        if res.evict:
            self.scheduler.hold(w.id, [r.spec.name for r in res.evict])
        seconds = e.load_time(model)
        e.loads += 1
        w.preloading[model] = (e.now + seconds, seconds, res)
        e.at(e.now + seconds, "preloaded", f"{w.id} {model}")

    def preloaded(self, w: Gpu, model: str) -> None:
        _, seconds, res = w.preloading.pop(model)
        resident = w.cache.resident[model]
        resident.ready.set()
        w.cache.release(res)
        if not w.gone:  # a retired worker's load is lost with it
            self.scheduler.recorded((model, resident.footprint_gb, seconds))
            self.scheduler.hold(w.id, [], model)
            self.engine.steps.loaded(model)
