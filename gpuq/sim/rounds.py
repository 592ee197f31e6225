"""The reaper in a replay (gpuq only): its rounds and passes on the engine's virtual clock.

Round k runs at k x ``reap_interval_s`` while the reaper has work: a queued deadline may
lapse, a queued P0/P1 task has a running, preemptible, lower-priority task to plan
around, or tenants are registered and tasks queued or running (their demand moves the
bounds every round: gpuq.reaper.tenant_room). An urgent enqueue brings a preemption pass
(as it wakes the real reaper), and a pass that decided nothing but said when one could
comes again at that time.

Skip-ahead: a round that decided nothing and woke no GPU left the pool as it was, so the
rounds after it are skipped up to the first that could decide something, unless an event
that may change the pool comes first (never while a tenant is bound: its bound follows the
demand round by round; without a bound, a quiet round only decays demand, which binds
nobody). That does not change the report
(docs/SIMULATOR.md says why).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from typing import Protocol

from gpuq.config import Config
from gpuq.reaper.loop import URGENT_GAP_S
from gpuq.sim.model import TraceTask
from gpuq.sim.policies import GpuqScheduler, Scheduler

# an urgent enqueue's preemption pass runs this long after it: the reaper's wake-up from its
# blocking pop and its read of the pool (milliseconds on a real server)
URGENT_REACTION_S = 0.005


class Replay(Protocol):
    """What the rounds need of the engine: its clock and pool, and a pass's effects."""

    config: Config
    scheduler: Scheduler
    now: float
    seq: int  # of the last event queued
    longest_load: float  # seconds: expiry looks this far ahead for cold loads

    def at(self, t: float, kind: str, key: str = "", gen: int = 0,
           queued: float | None = None) -> None: ...

    def ms(self, t: float | None = None) -> int: ...

    def seconds(self, ms: int) -> float: ...

    def running(self) -> Iterator[TraceTask]: ...

    def apply(self, done: dict[str, int]) -> None: ...


class Rounds:
    def __init__(self, engine: Replay) -> None:
        self.engine = engine
        self.every = engine.config.reap_interval_s
        # waiting tasks per priority, and those with a deadline: the reaper has work only
        # while a deadline can lapse or an urgent task could preempt a running one
        self.queued = [0, 0, 0, 0]
        self.queued_deadlines = 0
        self.expired = [0, 0, 0, 0]  # expiries per priority taken off `queued` so far
        self.by_model: Counter[str] = Counter()  # waiting tasks per model (expiries not taken off)
        # rounds are numbered on their cadence (round k at k x reap_interval_s)
        self.next: int | None = None  # the scheduled one
        self.seq = 0  # its event's seq; the event of a round moved since is ignored
        self.last = -1
        # skipping: the scheduled round is the first that may decide anything until an
        # event that may change the pool
        self.skip_ahead = True  # False: every round runs (the tests compare)
        self.tenancy = False  # tenants registered: rounds keep room for their demand
        self.skipping = False
        self.next_plan = -URGENT_GAP_S  # the last urgent pass
        self.timed_plan = -1.0  # the last pass brought forward to a planner's quiet time

    @property
    def scheduler(self) -> GpuqScheduler:
        assert isinstance(self.engine.scheduler, GpuqScheduler)
        return self.engine.scheduler

    def count_queued(self, task: TraceTask, delta: int) -> None:
        self.queued[task.priority] += delta
        self.by_model[task.model] += delta
        if task.deadline_s is not None:
            self.queued_deadlines += delta

    def take_off_expired(self, task: TraceTask | None = None) -> None:
        """Expired tasks leave ``queued``: those the reaper's round expired (read from the
        pool's counts), or ``task``, which its requeue expired (never counted back)."""
        if task is not None:
            self.expired[task.priority] += 1
            return
        now = self.scheduler.expired_by_level()
        for p in range(4):
            self.queued[p] -= now[p] - self.expired[p]
        self.expired = now

    def has_work(self) -> bool:
        """Whether a round could change anything: a queued deadline may lapse, or a queued
        P0/P1 task has a running, preemptible, lower-priority task to plan around."""
        if self.queued_deadlines > 0:
            return True
        if self.tenancy and (any(self.queued) or next(self.engine.running(), None) is not None):
            return True
        urgent = next((p for p in (0, 1) if self.queued[p] > 0), None)
        if urgent is None:
            return False
        return any(t.preemptible and t.priority > urgent for t in self.engine.running())

    def ensure(self) -> None:
        """Schedule the reaper's next round, on its cadence, when it has something to do."""
        if (isinstance(self.engine.scheduler, GpuqScheduler) and self.next is None
                and self.has_work()):
            self.schedule(max(self.last + 1, int(self.engine.now / self.every) + 1))

    def schedule(self, k: int, queued: float | None = None) -> None:
        self.next = k
        self.engine.at(k * self.every, "tick", queued=queued)
        self.seq = self.engine.seq

    def urgent(self) -> None:
        """Enqueue woke the reaper: one pass, unless one is pending (it plans for every
        waiting task), and passes at least URGENT_GAP_S apart."""
        now = self.engine.now
        if self.next_plan < now:
            self.next_plan = max(now + URGENT_REACTION_S, self.next_plan + URGENT_GAP_S)
            self.engine.at(self.next_plan, "plan")

    def tick(self) -> bool:
        """One round of the reaper; whether it decided anything."""
        assert self.next is not None
        self.last, self.next = self.next, None
        self.skipping = False
        done = self.scheduler.tick(self.engine.ms(), int(self.engine.longest_load * 1000),
                                   deadlines=self.queued_deadlines > 0,
                                   urgent=self.queued[0] + self.queued[1] > 0,
                                   tenants=self.tenancy)
        if done.get("expired"):  # off the waiting counts, per priority (stats: one read)
            self.queued_deadlines -= done["expired"]
            self.take_off_expired()
        self.engine.apply(done)
        self.ensure()
        self.plan_when_quiet_ends()
        return any(done.values())

    def plan_when_quiet_ends(self) -> None:
        """As the reaper does: a pass that decided nothing but said when one could (a victim
        coming of age, a reservation ending) before the cadence's next round brings the next
        pass forward to then (gpuq.reaper.loop.Reaper.planned_pass)."""
        quiet = self.scheduler.reaper.preemptor.quiet_until
        if quiet is None:
            return
        at, now = self.engine.seconds(quiet), self.engine.now
        if now < at < (math.floor(now / self.every) + 1) * self.every and at != self.timed_plan:
            self.timed_plan = at
            self.engine.at(at, "plan")

    def skip(self) -> None:
        """After a round that decided nothing and woke no GPU the pool is as it was before
        it, and the next rounds differ only in their time: none decides anything before
        the first time one could (the scheduler says when). The last round before it
        replaces the next one, until an event that may change the pool: that round brings
        the planner's pass forward to that time, as the reaper's would (a round at or after
        it would plan later than production)."""
        if not self.skip_ahead or self.next is None or (self.tenancy and self.scheduler.reaper.room.binding):
            return  # a bound follows the tenants' demand round by round: none is like the last
        ms, every = self.engine.ms, self.every
        quiet = self.scheduler.quiet_until(int(self.engine.longest_load * 1000),
                                           deadlines=self.queued_deadlines > 0,
                                           urgent=self.queued[0] + self.queued[1] > 0)
        # the workers' leases (from their heartbeat at 0) end some day: liveness changes then
        leases_end = ms(0.0) + int(self.engine.config.lease_s * 1000)
        until = leases_end if quiet is None else min(quiet, leases_end)
        k = max(self.next, math.floor(self.engine.seconds(until) / every) - 2)
        while ms(k * every) < until:
            k += 1
        k -= 1  # the last round before it (it decides nothing, then plans at that time)
        if k > self.next:
            self.skipping = True
            self.schedule(k, queued=(k - 1) * every)

    def resume(self, queued: float) -> None:
        """An event that may change the pool ends a skip: the next round is the first of the
        cadence that would run after this event, queued as the cadence would have queued it
        (by the round before it), so that it keeps its place among simultaneous events."""
        if not self.skipping:
            return
        self.skipping = False
        now, every = self.engine.now, self.every
        k = max(self.last + 1, math.floor(now / every) - 1)
        while (k * every, (k - 1) * every) < (now, queued):
            k += 1
        assert self.next is not None
        if k < self.next:
            self.schedule(k, queued=(k - 1) * every)
