"""The tasks a worker is running: one ``Running`` per task, in one ``RunningSet``.

The set is shared by the runners (track, untrack), the heartbeat (renews their leases) and
control (yield deadlines); it also keeps when a task last started or ended (the idle
timeout) and how many tasks ran. A batch's tasks are tracked one by one (each has its own
lease) but take one slot together: the tasks added to a batch are ``batched``. A task whose
handler is ``async def`` runs on the worker's event loop (gpuq.worker.eventloop) while its
runner thread waits: stopping it cancels its asyncio task instead of raising in the thread.
A run whose task this worker claimed again is ``superseded``: it holds its slot and control
watches it (stopped past the grace, as a lost run) until its handler returns.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuq.app import Context
from gpuq.errors import StopTask
from gpuq.worker.eventloop import AsyncCall

if TYPE_CHECKING:
    from gpuq.worker.models import Reservation

log = logging.getLogger(__name__)
YIELDED = "yielded to a higher-priority task"
SHUT_DOWN = "worker shut down"

@dataclass
class Running:
    task_id: str
    token: int
    ctx: Context
    started: float
    thread_id: int = 0  # the runner thread calling the handler
    yield_deadline: float | None = None  # monotonic: asked to yield, stopped after this
    leaving: bool = False  # asked to yield by the worker's shutdown, not by the planner
    stop_deadline: float | None = None  # monotonic: stopped, the worker exits after this
    lost_deadline: float | None = None  # monotonic: its lease is gone, stopped after this
    run_deadline: float | None = None  # monotonic: its handler call ends its timeout_s then
    timeout_s: float = 0.0  # its handler's bound, for the task's error
    stopped: bool = False  # requeued by the worker, or lost: whatever the handler does is moot
    # its outcome once its handler returns, where stopped: "stopped" (requeued past its yield
    # deadline), "failed" or "retried" (failed past its timeout), else "lost" (its lease
    # gone): counted then, after its run phase
    stopped_as: str = "lost"
    in_handler: bool = False
    rejected: str | None = None  # why this worker will not run it (execute fails it)
    batched: bool = False  # added to the batch of another task: it uses that task's slot
    handed: bool = False  # a warm hand-over: its began goes with its handler (gpuq.worker.takeup)
    start_by: float | None = None  # monotonic: a hand-over's began is waited for after this
    aio: AsyncCall | None = None  # its async handler's run on the event loop, while in it
    reservation: Reservation | None = None  # its memory in the ledger, until released (once)
    guard: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, aio: AsyncCall | None = None) -> None:
        """The handler starts: in its runner thread, or (``aio``) on the event loop."""
        with self.guard:
            self.in_handler = True
            self.aio = aio

    def leave(self) -> None:
        with self.guard:
            self.in_handler = False
            self.aio = None

    def timed_out(self) -> str | None:
        """The error of a handler call that returned past its ``timeout_s`` while control's
        fail of it was not sent (Redis away, the worker frozen): it fails as that would
        have; None when it returned in time (or control failed it: ``run_deadline`` gone)."""
        if self.run_deadline is None or time.monotonic() < self.run_deadline:
            return None
        return self.timeout_error

    @property
    def timeout_error(self) -> str:
        """Its task's error when its handler call ran past its ``timeout_s``."""
        return f"ran past its {self.timeout_s:g} s timeout"

    def gives_way(self) -> tuple[str, str]:
        """The reason and ``preempted`` kind of this run's requeue once its handler yields:
        at the worker's shutdown it goes back as a give-back does (no preemption counted)."""
        return (SHUT_DOWN, "") if self.leaving else (YIELDED, "yielded")

    def interrupt(self) -> bool:
        """Stop the handler, only while it is inside it (the guard keeps the stop out of the
        worker's own code). A blocking handler gets StopTask raised in its thread, at its
        next Python step (a handler blocked in native code does not see it); an async one
        has its asyncio task cancelled (CancelledError at its current await)."""
        with self.guard:
            if not self.in_handler:
                return False
            if self.aio is not None:
                return self.aio.cancel()
            done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id),
                                                              ctypes.py_object(StopTask))
            return bool(done)


class RunningSet:
    def __init__(self) -> None:
        # the condition's lock, taken bare (its waits and notifies need it held): a
        # Condition's ``with`` is a Python-level call, several a task on the runner's path
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        # threads in a wait on _changed: a one-slot worker's runner ends a task with none, and
        # Condition.notify_all is two Python calls and a check that the lock is held
        self._waiting = 0
        self._running: dict[str, Running] = {}
        # runs that ended whose ack, fail or requeue is not answered yet (it rides with the
        # next claim, which an outage holds back): task id -> run. Their leases stay
        # renewed, or a reaper would take back a finished task and its result be refused
        self._settling: dict[str, Running] = {}
        # runs whose task was claimed again while they ran: until their handlers return they
        # take their slots (the GPU is busy) and control stops them past the grace
        self._superseded: list[Running] = []
        self._last_active = time.monotonic()  # a task started or ended
        self.tasks_run = 0
        self.reservations = 0  # "reserved" control messages read: the planner holds this worker

    def __len__(self) -> int:
        return len(self._running) + len(self._superseded)

    def track(self, *runs: Running) -> None:
        with self._lock:  # a batch's runs under one lock
            for run in runs:
                old = self._running.get(run.task_id)
                if old is not None and old is not run:
                    # the task was taken back (an operator's requeue) and this worker claimed
                    # it again while the old run still runs: that run's lease is gone, its
                    # handler told so (should_stop) and whatever it returns moot
                    old.ctx.lost = old.stopped = True
                    self._superseded.append(old)
                    log.warning("task.superseded task=%s worker=%s token=%d: claimed again while "
                                "this run runs; stopped past the grace unless it stops",
                                run.task_id, old.ctx.worker_id, old.token)
                self._running[run.task_id] = run
                # an earlier run of the task on this worker (stopped: no ack to settle it) is
                # superseded by this claim's token: renewing both, the beat would read the
                # old one's refusal as this run's lease lost (heartbeat.lua names task ids)
                self._settling.pop(run.task_id, None)
            self._last_active = time.monotonic()

    def untrack(self, *ended: str | Running) -> None:
        """The runs ended (their slots are free); their leases are kept until ``settled``. A
        run given as a Running leaves only itself: not a later run of its task (``track``)."""
        with self._lock:
            for one in ended:
                task_id = one if isinstance(one, str) else one.task_id
                if not isinstance(one, str) and self._running.get(task_id) is not one:
                    # superseded: the task's later run on this worker goes on
                    self._superseded = [r for r in self._superseded if r is not one]
                    continue
                run = self._running.pop(task_id, None)
                if run is not None:
                    self._settling[task_id] = run
            self.tasks_run += len(ended)
            self._last_active = time.monotonic()
            if self._waiting:
                self._changed.notify_all()

    def settled(self, task_id: str, token: int) -> None:
        """The run's ack, fail or requeue was answered (or its lease is gone): no more renewals."""
        with self._lock:
            run = self._settling.get(task_id)
            if run is not None and run.token == token:
                del self._settling[task_id]

    def settled_all(self, ended: list[tuple[str, int]]) -> None:
        """``settled`` for each (task id, token), under one lock: a batch's acks."""
        with self._lock:
            for task_id, token in ended:
                run = self._settling.get(task_id)
                if run is not None and run.token == token:
                    del self._settling[task_id]

    def settling(self) -> list[tuple[str, int]]:
        with self._lock:
            return [(task_id, run.token) for task_id, run in self._settling.items()]

    def held_by(self, thread_id: int) -> tuple[list[Running], list[Running]]:
        """The runs a runner thread took: those tracked (superseded ones too), and those it
        ended whose ack, fail or requeue is not answered yet."""
        with self._lock:
            tracked = [r for r in [*self._running.values(), *self._superseded] if r.thread_id == thread_id]
            return tracked, [r for r in self._settling.values() if r.thread_id == thread_id]

    def slots_used(self) -> int:
        """Runner slots taken: one per task, or per batch."""
        # a one-slot worker's every claim: nothing runs, read without the lock. A claim holds
        # the cache lock, under which alone runs are tracked: while it reads, the runs only
        # end, so "none" is what the lock would answer (elsewhere it is a moment's answer)
        if not (self._running or self._superseded):
            return 0
        with self._lock:
            return sum(1 for r in [*self._running.values(), *self._superseded] if not r.batched)

    def snapshot(self) -> list[Running]:
        with self._lock:
            return list(self._running.values())

    def superseded(self) -> list[Running]:
        with self._lock:
            return list(self._superseded)

    def watched(self) -> list[Running]:
        """The runs control enforces deadlines on: the tracked ones and the superseded."""
        with self._lock:
            return [*self._running.values(), *self._superseded]

    def wait(self, timeout: float, *, unless_empty: bool = False) -> bool:
        """Wait up to ``timeout`` for a task to end. With ``unless_empty``, return False at
        once, without waiting, when none runs."""
        with self._lock:
            if unless_empty and not self._running:
                return False
            self._waiting += 1
            try:
                self._changed.wait(timeout)
            finally:
                self._waiting -= 1
            return True

    def nudge(self, reserved: bool = False) -> None:
        """Wake a batch waiting for more tasks (``wait_until``): the worker stops, a yield
        was asked, or (``reserved``) the planner reserved this worker for a waiting task."""
        with self._lock:
            self.reservations += reserved
            self._changed.notify_all()

    def wait_until(self, done: Callable[[], bool], timeout: float) -> None:
        """Wait up to ``timeout`` for ``done``, checked at every change and nudge."""
        with self._lock:
            self._waiting += 1
            try:
                self._changed.wait_for(done, timeout)
            finally:
                self._waiting -= 1

    def idle_s(self) -> float:
        """Seconds since a task last started or ended."""
        return time.monotonic() - self._last_active

    def touch(self) -> None:
        """Count as active now: the idle timeout starts again."""
        self._last_active = time.monotonic()
