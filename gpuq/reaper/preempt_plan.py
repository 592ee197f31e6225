"""The preemption planner's rules, pure: what the reaper decides for P0/P1 tasks that fit
no idle worker, or that enqueue offered to a busy GPU holding their model
(gpuq.reaper.preempt reads the pool and commits the decisions).

For each such task, the candidates are running, preemptible, lower-priority tasks on live
workers whose GPU is large enough (usable VRAM >= the task's need; a group of at least its
GPUs) and which serve the task's priority and run its handler; where no one of a worker's
victims makes room alone (a group, or several slots, running several tasks), the fewest of
them that together do are one option (gpuq.reaper.preempt_options: waited for until the last
ends, or each asked to yield); for a task offered to a busy holder of its model, only that
holder's (an idle worker would load the model cold: 30-60 s, against a yield). A natural end
(started + estimate) is waited for only where it comes within ``max_wait_s`` and by the
task's latest start (its deadline less its estimate; past it the task expires), never when
overdue (its estimate passed: a cold load, a slow run) while a victim may be asked:

- while the SLA can still be met, an option due to end by the waiting task's start-by time
  (its queue score: enqueue + SLA): reserve its worker (the worker's next claim is the
  waiting task); nothing is interrupted;
- once the start-by time has passed (a yield no longer saves the SLA), the soonest end if it
  comes within ``grace_s``, the longest a victim asked to yield may take;
- otherwise ask a victim to yield within ``grace_s`` (and reserve its worker): the
  soonest-ending candidate that has run ``preempt_min_runtime_s`` and was preempted fewer
  than ``preempt_max`` times. Past the grace the worker stops it (gpuq.worker.control).
- no candidate may be asked yet: wait for the soonest end, unless one may be asked, plus the
  grace, before that end could come (then nothing until it may be: ``quiet_until``); not
  for a task an idle worker will load cold once the holder's offer lapses.

Waiting up to ``max_wait_s`` (30 s) for a 200 ms SLA would miss it for certain, so the
start-by time bounds the graceful wait while the SLA can still be met; past it, the grace
bounds it, so a late online task waits no longer than asking would take.

A waiting task whose tenant is at a limit takes only room its own tenant gives back
(gpuq.reaper.preempt_limits). A worker and a victim serve one waiting task per round.
``quiet_until`` says, from the same inputs, how long a plan that decided nothing stays
empty while the pool does not change: the reaper plans again then if that comes before its
next round, and the simulator skips the rounds in between.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpuq.config import Config
from gpuq.reaper.preempt_limits import Limits
from gpuq.reaper.preempt_options import (
    Idle,
    Option,
    Victim,
    Waiting,
    askable_at,
    candidates_for,
    idle_takes,
    may_be_asked,
    of_age,
    own_charge,
)


@dataclass(frozen=True)
class Decision:
    kind: str  # "reserve" | "yield"
    waiting: Waiting
    victims: tuple[Victim, ...]  # on one worker: each asked to yield, or all waited for
    ends_in_s: float

    @property
    def victim(self) -> Victim:  # the first (the only one, but where several make room)
        return self.victims[0]


def plan(waiting: list[Waiting], victims: list[Victim], idle: list[Idle],
         reserved: set[str], config: Config, now_ms: int,
         limits: Mapping[str, Limits] | None = None) -> list[Decision]:
    """Decisions for the waiting tasks, most urgent first. idle: the idle workers' shapes
    (a worker skipping models stands alone: it takes none of their tasks); reserved:
    workers that already have a reservation; limits: the waiting tasks' tenants that have
    any (preempt_limits.read_limits)."""
    used: set[str] = set(reserved)
    room = dict(limits or {})  # with the starts decided so far counted
    out: list[Decision] = []
    wait_ms, grace_ms = int(config.max_wait_s * 1000), int(config.grace_s * 1000)
    for w in sorted(waiting, key=lambda t: t.priority):
        if w.latest_ms is not None and w.latest_ms < now_ms:
            continue  # it cannot end by its deadline: it expires, and no room helps it
        fits = candidates_for(w, victims, idle, used, room.get(w.tenant),
                              lambda v: may_be_asked(v, config, now_ms), now_ms)
        if not fits:
            continue
        soonest = min(fits, key=lambda o: o.ends_ms)
        promised = soonest.ends_ms > now_ms  # an overdue end (a cold load, a slow run) promises nothing
        # offered to a busy holder while a GPU idles: waited for only by its start-by time
        # (the idle GPU loads its model once the offer lapses); never past the task's
        # latest start (its deadline less its estimate): it would expire waiting
        may_wait = (soonest.ends_ms <= min(now_ms + wait_ms, w.latest_ms or now_ms + wait_ms)
                    and not idle_takes(w, idle, room.get(w.tenant), now_ms))
        graceful: Option | None = None
        if w.start_by_ms is not None and w.start_by_ms > now_ms:
            # the SLA can still be met: wait only for a victim due to end by the start-by time
            by = min(w.start_by_ms, now_ms + wait_ms)
            graceful = min((o for o in fits if now_ms < o.ends_ms <= by), key=lambda o: o.ends_ms,
                           default=None)
        elif may_wait:
            # past it, a natural end is waited for only if it comes before a yield must (an
            # overdue one promises nothing), and by the task's latest start
            by = min(now_ms + grace_ms, w.latest_ms or now_ms + grace_ms)
            graceful = min((o for o in fits if now_ms < o.ends_ms <= by), key=lambda o: o.ends_ms,
                           default=None)
        ran_enough = [o for o in fits if all(may_be_asked(v, config, now_ms) for v in o.victims)]
        if graceful is None and ran_enough:
            chosen = min(ran_enough, key=lambda o: o.ends_ms)
            kind = "yield"
        elif graceful is not None or may_wait and waits_for(
                soonest.ends_ms if promised else None,
                askable_at(candidates_for(w, victims, idle, used, room.get(w.tenant),
                                          lambda v: v.preemptions < config.preempt_max, now_ms), config),
                grace_ms):
            # nothing may be interrupted before the soonest natural end could come (a
            # victim asked once it ran its minimum may take the grace): wait for it
            chosen, kind = graceful or soonest, "reserve"
        else:  # planned again once a victim may be asked (quiet_until) or an end comes near
            continue
        decision = Decision(kind, w, chosen.victims, max(0.0, (chosen.ends_ms - now_ms) / 1000))
        used.add(chosen.worker)
        if (limit := room.get(w.tenant)) is not None:
            own = decision.victim.charge if own_charge(w, decision.victim) else None
            room[w.tenant] = limit.after(own, (w.need_gb, w.gpus))
        out.append(decision)
    return out


def waits_for(end_ms: int | None, first_ask_ms: float, grace_ms: int) -> bool:
    """Whether the soonest natural end (None: overdue, no promise) is waited for while no
    victim may be asked yet: unless one may be, plus the grace, before it could come
    (first_ask_ms: askable_at over the options any victim below preempt_max makes, as
    quiet_until sees them; inf: none ever)."""
    return first_ask_ms == math.inf or end_ms is not None and first_ask_ms + grace_ms >= end_ms


def quiet_until(waiting: list[Waiting], victims: list[Victim], idle: list[Idle],
                reserved: set[str], config: Config,
                limits: Mapping[str, Limits] | None = None, *, now_ms: int | None = None) -> int | None:
    """For inputs on which ``plan`` decided nothing (at ``now_ms``): the first time (ms) at
    which it decides something on the same inputs; None: never, until the pool changes.

    With no decision, every task is planned against the same candidates (no worker gets
    used), and a task with candidates gets none exactly while none of them may be asked to
    yield and no natural end is waited for: none due by its start-by time within
    ``max_wait_s``, and its soonest beyond ``max_wait_s``, past its latest start, or later
    than a victim may be asked plus the grace. Time alone ends that when an end due by the
    start-by time, or the soonest end where it is waited for, comes within ``max_wait_s``
    (not the soonest for a task offered to a busy holder while a GPU idles: it is not waited
    for) or a candidate reaches its minimum runtime; or, sooner maybe, when a worker's skip
    of a task's model ends (its victims become candidates then). An idle worker's skip
    counts until the pool changes: its end only makes an idle worker take a task, so that
    plans decide less, never more. An end at or before ``now_ms`` (overdue) is never waited
    for by the start-by time. Where a worker's victims make room only together, the set of
    those that may be asked grows as each comes of age, and one coming of age may complete
    a set ending sooner than those seen here: each such victim's coming of age counts too,
    so the time may come early (a pass that decides nothing), never late."""
    wait_ms, grace_ms = int(config.max_wait_s * 1000), int(config.grace_s * 1000)
    times: list[int] = []
    limits = limits or {}
    for w in waiting:
        if w.latest_ms is not None and now_ms is not None and w.latest_ms < now_ms:
            continue  # the plan passes it over from now on
        mine = [end for _, end in w.skipped_by]
        # a set of victims below preempt_max may be asked once its youngest ran its minimum
        fits = candidates_for(w, victims, idle, reserved, limits.get(w.tenant),
                              lambda v: v.preemptions < config.preempt_max)
        if fits:
            if w.start_by_ms is not None:  # due by the start-by time: waited for within max_wait_s
                mine += [o.ends_ms - wait_ms for o in fits
                         if (now_ms is None or o.ends_ms > now_ms) and o.ends_ms <= w.start_by_ms]
            # the soonest once within max_wait_s, unless past its latest start or a victim
            # may be asked before it could come (plan's rule); past the start-by time, any end
            # by the latest start once within the grace
            soonest_ms = min(o.ends_ms for o in fits)
            if not idle_takes(w, idle, limits.get(w.tenant)) and soonest_ms <= (w.latest_ms or soonest_ms):
                if (now_ms is None or soonest_ms > now_ms) and waits_for(soonest_ms, askable_at(fits, config),
                                                                         grace_ms):
                    mine.append(soonest_ms - wait_ms)
                for o in fits:
                    t = max(o.ends_ms - grace_ms, w.start_by_ms or 0)
                    if (now_ms is None or o.ends_ms > now_ms) and t < o.ends_ms <= (w.latest_ms or o.ends_ms):
                        mine.append(t)
            for o in fits:
                if all(v.preemptions < config.preempt_max for v in o.victims):
                    mine.append(of_age(o.victims, config))
            # where a worker's victims make room only together, the set of those that may be
            # asked grows as each comes of age, and a later one may end sooner than the set
            # seen here: each such victim's coming of age (a pass then may decide nothing)
            sets = {v.worker for o in fits if len(o.victims) > 1 for v in o.victims}
            ages = [of_age((v,), config) for v in victims
                    if v.worker in sets and v.preemptions < config.preempt_max]
            mine += [t for t in ages if now_ms is None or t > now_ms]
        # past its latest start the plan passes it over (it expires)
        times += [t for t in mine if w.latest_ms is None or t <= w.latest_ms]
    return min(times, default=None)
