"""The model cache and VRAM ledger of one GPU.

free = total - KV reserve - footprints of resident (or loading) models - working memory of
running tasks. The ledger is what the worker tells the claim script; it is authoritative,
and NVML readings only cross-check it. Several models stay resident while they fit; when a
cold model needs room, idle models are evicted least-recently-used first, never one in use.
All methods that change the ledger run under one lock, together with the claim call.

A model's weights count once however many tasks use it: the first task of a model not held
reserves its footprint plus its working memory (its ``vram_gb`` above the footprint), each
further task of a held (or loading) model its working memory alone, so N concurrent tasks of
one model hold footprint + N x working. An async loader or unloader runs on the worker's event
loop (``aio``, gpuq.worker.eventloop), where the model's async handlers run too.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpuq.app import App, ModelSpec
from gpuq.worker.eventloop import EventLoop
from gpuq.worker_record import usable_gb

log = logging.getLogger(__name__)


@dataclass
class Resident:
    spec: ModelSpec
    footprint_gb: float
    in_use: int = 0
    obj: Any = None
    ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    # listed as held (holders set, the hash's models) while it loads: a task's load is, from
    # its start (gpuq.worker.loading); a preload only once loaded
    shown: bool = False


class Reservation(NamedTuple):
    """What running one task holds: its model (and whether it must be loaded) and memory (a
    tuple, one a task: gpuq.call)."""

    model: str
    working_gb: float
    cold: bool  # this task loads the model
    evict: tuple[Resident, ...]  # idle models to unload first (for a held model's task too)
    # the model was still loading here (a preload, another slot's task): the handler waits
    # for that load, so the task starts cold all the same (its SLA decided by began.lua)
    waits: bool = False


class ModelCache:
    def __init__(self, app: App, total_gb: float, reserve_gb: float,
                 aio: EventLoop | None = None) -> None:
        self.app = app
        self.aio = aio if aio is not None else EventLoop()  # started only if something is async
        self.total_gb = total_gb
        self.reserve_gb = reserve_gb
        self.lock = threading.RLock()
        self.resident: OrderedDict[str, Resident] = OrderedDict()  # LRU order: oldest first
        self.working_gb = 0.0
        # models evicted from the ledger whose unload (outside the lock) has not ended: their
        # memory is not free yet, or another runner's claim could load into it
        self.unloading: list[Resident] = []
        # a held model's task within its weights holds nothing more: its reservation is the
        # same for every such task (a batch's, mostly), made once per model
        self._within: dict[str, Reservation] = {}

    def free_gb(self) -> float:
        return self.ledger()[0]

    def evictable_gb(self) -> float:
        return self.ledger()[1]

    def loaded(self) -> list[tuple[str, float]]:
        return self.ledger()[2]

    def in_use(self) -> frozenset[str]:
        """The loaded models a running task uses, or that are still loading (not in
        evictable_gb)."""
        return self.ledger()[3]

    def loading(self) -> frozenset[str]:
        """The models whose load has not ended (a task of one starts when it does)."""
        return self.ledger()[4]

    def ledger(self) -> tuple[float, float, list[tuple[str, float]], frozenset[str], frozenset[str]]:
        """What each claim reports, in one pass: the free VRAM (usable less what is loaded,
        reserved for running tasks and still unloading), the evictable VRAM (loaded models no
        running task uses), the loaded models with their footprints, those in use (a load
        under way included: it is not evicted), and those still loading."""
        loaded, in_use, loading, held, idle = [], [], [], 0.0, 0.0
        for name, r in self.resident.items():
            loaded.append((name, r.footprint_gb))
            held += r.footprint_gb
            if not r.ready.is_set():
                loading.append(name)
                in_use.append(name)
            elif r.in_use > 0:
                in_use.append(name)
            else:
                idle += r.footprint_gb
        used = held + self.working_gb
        if self.unloading:  # mostly none: no generator for them at every claim
            used += sum(r.footprint_gb for r in self.unloading)
        return (usable_gb(self.total_gb, self.reserve_gb) - used, idle, loaded, frozenset(in_use),
                frozenset(loading))

    def model_names(self) -> list[str]:
        """The models the pool sees this worker hold: loaded, or loading for a task."""
        return [name for name, r in self.resident.items()
                if (r.ready.is_set() or r.shown) and r.error is None]

    def reserve(self, model: str, need_gb: float) -> Reservation | None:
        """Account for a claimed task; None if it cannot fit on this GPU even after evicting."""
        with self.lock:
            return self.reserve_held(model, need_gb)

    def reserve_held(self, model: str, need_gb: float) -> Reservation | None:
        """``reserve`` by a caller holding the lock (a worker's claim: its lock taken again,
        re-entrant, would cost a task an argument parse and two calls)."""
        held = self.resident.get(model)
        if held is not None:
            # as claim.lua's fit: the other idle models make room for a held model's task
            working = need_gb - held.footprint_gb
            waits = not held.ready.is_set()
            if not working > 0.0:  # nothing to evict (_room_for); max(0.0, ...) without its call
                held.in_use += 1
                self.resident.move_to_end(model)
                if waits:
                    return Reservation(model, 0.0, False, (), True)
                within = self._within.get(model)
                if within is None:
                    within = self._within[model] = Reservation(model, 0.0, False, ())
                return within
            evict = self._room_for(working, keep=model)
            if evict is None:
                return None
            if evict:
                self._drop(evict)
            held.in_use += 1
            self.resident.move_to_end(model)
            self.working_gb += working
            return Reservation(model, working, False, tuple(evict), waits)
        spec = self.app.model_spec(model)
        if spec is None:
            return None
        footprint = spec.footprint(need_gb)
        working = max(0.0, need_gb - footprint)
        evict = self._room_for(footprint + working)
        if evict is None:
            return None
        self._drop(evict)
        self.resident[model] = Resident(spec, footprint, in_use=1)
        self.working_gb += working
        return Reservation(model, working, True, tuple(evict))

    def _room_for(self, need_gb: float, keep: str | None = None) -> list[Resident] | None:
        """The idle models other than ``keep`` to evict, least recently used first, for
        need_gb to fit; None if even all of them would not make room."""
        evict: list[Resident] = []
        if need_gb <= 0:  # a held model's task within its weights: nothing more to hold, as
            return evict  # claim.lua sees it, even while an evicted model still unloads
        free = self.free_gb()
        for resident in self.resident.values():
            if free >= need_gb - 1e-9:
                break
            if resident.in_use == 0 and resident.ready.is_set() and resident.spec.name != keep:
                evict.append(resident)
                free += resident.footprint_gb
        return evict if free >= need_gb - 1e-9 else None

    def _drop(self, evict: list[Resident]) -> None:
        """Take idle models off the ledger; each counts as unloading until ``unload``."""
        for resident in evict:
            del self.resident[resident.spec.name]
        self.unloading += evict

    def unload_all(self, residents: list[Resident], until: float, hurry: threading.Event) -> None:
        """Run the unloaders of evicted models in a thread of their own and wait for them
        until ``until`` (monotonic) or ``hurry`` (a second signal): an unloader that never
        returns must not keep the worker from exiting (the process's exit frees the GPU)."""
        if not residents:
            return

        def run() -> None:
            for resident in residents:
                self.unload(resident)

        thread = threading.Thread(target=run, name="unload", daemon=True)
        thread.start()
        while thread.is_alive() and not hurry.is_set() and (left := until - time.monotonic()) > 0:
            thread.join(min(0.1, left))
        if thread.is_alive():
            log.error("model.unload_timeout models=%s: the unloaders did not return in time; the "
                      "worker exits without them", ",".join(r.spec.name for r in residents))

    def get(self, model: str) -> Resident:
        return self.resident[model]

    def release(self, reservation: Reservation) -> None:
        with self.lock:
            self.working_gb -= reservation.working_gb
            resident = self.resident.get(reservation.model)
            if resident is None:
                return
            if reservation.cold and not resident.ready.is_set():
                # the task that was to load the model ended before loading it: the model is
                # not coming, so tasks waiting for it must not wait forever
                resident.error = RuntimeError("the task loading it ended before the load")
                resident.ready.set()
            resident.in_use -= 1
            if resident.error is not None and resident.in_use == 0:
                del self.resident[reservation.model]  # a failed or abandoned load holds nothing

    def load(self, resident: Resident) -> float:
        """Run the app's loader (outside the lock); returns seconds taken. Waiters block on ready."""
        start = time.perf_counter()
        try:
            obj = resident.spec.load(resident.spec.name)
            resident.obj = self.aio.wait(obj) if inspect.isawaitable(obj) else obj
        except BaseException as exc:
            resident.error = exc
            raise
        finally:
            resident.ready.set()
        return time.perf_counter() - start

    def unload(self, resident: Resident) -> bool:
        """Run the app's unloader of an evicted model (outside the lock); its memory counts
        as free once this returns. False when the unloader raised (logged): the app's error,
        which must not keep the other evicted models loaded nor stop the worker."""
        try:
            if resident.spec.unload is not None and resident.obj is not None:
                done = resident.spec.unload(resident.obj)
                if inspect.isawaitable(done):
                    self.aio.wait(done)
            return True
        except Exception as exc:
            log.error("model.unload_failed model=%s error=%s: %s", resident.spec.name,
                      type(exc).__name__, exc)
            return False
        finally:
            resident.obj = None
            with self.lock:
                self.unloading = [r for r in self.unloading if r is not resident]

    def evict_idle(self) -> list[Resident]:
        """Drop every idle model from the ledger (idle timeout); the caller unloads them."""
        with self.lock:
            idle = [r for r in self.resident.values() if r.in_use == 0 and r.ready.is_set()]
            self._drop(idle)
            return idle
