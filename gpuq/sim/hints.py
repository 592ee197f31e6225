"""The reaper's scale step in a fixed-pool replay (gpuq only): its warm hints reach the GPUs.

The reaper runs ``Scaler.step`` in every round, every ``reap_interval_s``. A replay without an
autoscaler does too: round k's step runs at k x ``reap_interval_s``, after every event of that
instant (the round's expiry and planning included), and its hints reach the GPUs at once
(``Control.deliver``), as a control list's pop would. The step's other effects (the ``scale``
hash, the hook, the scaler's memory of est_s) reach nothing in a replay, so a step that hints
nothing changes nothing: only the steps that may hint are run (``every_round``: every step
runs, the check that this changes nothing compares both).

Whether a step may hint is decided from the replay's own state, a superset of
``gpuq.reaper.scale_plan``'s rules (``Gate``). With the pool unchanged (no event since the
last look) that answer changes only at the times ``Gate.look`` names, so the next look is at
the first round at or after the earliest of them, or after the next event.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Protocol

from gpuq.sim.hint_gate import Gate, Replay
from gpuq.sim.model import TraceTask
from gpuq.sim.policies import GpuqScheduler


class Pool(Replay, Protocol):
    """What the steps need of the engine besides the gate's: the replay's progress, the
    autoscaler (which runs the step itself), and where the hints go."""

    arrivals_left: int
    seq: int  # of the last event queued
    autoscaler: Any
    control: Any  # gpuq.sim.control.Control

    def seconds(self, ms: int) -> float: ...

    def waiting(self) -> int: ...

    def running(self) -> Iterator[TraceTask]: ...


class Steps:
    def __init__(self, engine: Pool) -> None:
        self.engine = engine
        # an autoscaled replay runs the step at its own cadence (gpuq.sim.autoscale)
        self.on = isinstance(engine.scheduler, GpuqScheduler) and engine.autoscaler is None
        self.every = engine.config.reap_interval_s
        self.every_round = False  # True: every round's step runs (the tests compare)
        self.next = 1  # the next round to look at
        self.changed = True  # an event may have changed the pool since the last look
        self.until = 0  # the pool unchanged, no step can hint before this round
        self.runs = self.looks = 0
        self.idle_runs: dict[str, int] = {}  # steps that hinted nothing, by what the gate saw
        self.gate = Gate(engine)

    def touch(self) -> None:
        """An event at the engine's now may have changed the pool: the round at or after it
        looks again."""
        if not self.on:
            return
        self.changed = self.gate.stale = True
        self.next = min(self.next, self.round_at(self.engine.now))

    def round_at(self, t: float) -> int:
        """The first round at or after virtual time t."""
        k = max(0, math.floor(t / self.every) - 1)
        while k * self.every < t:
            k += 1
        return k

    def arrived(self, task: TraceTask) -> None:
        if self.on:
            self.gate.arrived(task.model, self.engine.ms())

    def loaded(self, model: str) -> None:
        if self.on:
            self.gate.loaded(model)

    def active(self) -> bool:
        e = self.engine
        return bool(e.arrivals_left or e.waiting() or any(True for _ in e.running()))

    def before(self, t: float) -> bool:
        """The steps of the rounds before virtual time t (the next event's), up to one whose
        hints queued an event (a preload's end), which may come before t: then True."""
        e = self.engine
        queued = e.seq
        while self.on and self.next * self.every < t and e.seq == queued:
            k = self.next
            if not self.active():
                self.on = False  # the replay is over: no arrival, nothing queued or running
                break
            e.now = k * self.every
            if self.every_round:
                self.step()
                self.next = k + 1
                continue
            if self.changed or k >= self.until:
                self.changed = False
                self.looks += 1
                maybe, at_ms = self.gate.look()
                self.until = self.round_at(e.seconds(at_ms)) if at_ms is not None else 1 << 62
                if maybe:  # the step decides; if it hints nothing, the next round looks again
                    self.until = k + 1
                    self.step()
            self.next = k + 1 if self.changed else max(k + 1, self.until)
        return e.seq != queued

    def step(self) -> None:
        e = self.engine
        assert isinstance(e.scheduler, GpuqScheduler)
        self.runs += 1
        plan = e.scheduler.reaper.scaler.step(e.ms())
        e.control.deliver()
        if plan.hints:  # the GPUs took them: the pool changed
            self.changed = True
            self.gate.hinted()
            e.rounds.resume(e.now)
        elif not self.every_round:
            self.idle_runs[self.gate.why] = self.idle_runs.get(self.gate.why, 0) + 1
