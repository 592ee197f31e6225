"""The options a waiting task has in the preemption planner (gpuq.reaper.preempt): the
waiting task, the running tasks that may give way (victims), the idle workers, and which
victims, alone or several on one worker together, make room for it."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from gpuq.config import Config
from gpuq.reaper.preempt_limits import Charge, Limits


@dataclass(frozen=True)
class Waiting:
    id: str
    priority: int
    need_gb: float
    start_by_ms: int | None = None  # its queue score; None: no SLA bound on the wait
    offered: str = ""  # the worker enqueue offered it to (maybe a busy holder of its model)
    gpus: int = 1  # devices it runs across: only a group of at least that many can take it
    tenant: str = ""
    model: str = ""
    handler: str = ""  # "": any worker runs it
    # (worker, end ms) of the workers whose claims skip its model (its load failed there
    # lately: gpuq.worker.broken, read from `lanes`): no room is planned there until the end
    skipped_by: tuple[tuple[str, int], ...] = ()
    latest_ms: int | None = None  # its latest start (deadline less estimate); None: no deadline

    def skipped_on(self, now_ms: int | None) -> set[str]:
        """The workers skipping its model at now_ms (None: every one listed)."""
        return {w for w, end in self.skipped_by if now_ms is None or end > now_ms}


@dataclass(frozen=True)
class Victim:
    id: str
    token: int
    worker: str
    priority: int
    started_ms: int  # when its work began: its start, or for a cold start its model's load end
    est_s: float
    preemptions: int
    # the worker's usable VRAM (its whole group's) less what its other running tasks need:
    # what the waiting task finds once this victim ends (a batch's siblings or a
    # non-preemptible neighbour keep theirs)
    room_gb: float
    levels: str  # priorities the worker serves
    gpus: int = 1  # devices in the worker's group
    charge: Charge | None = None  # what its end gives back to its tenant's limits
    freed_gb: float = 0.0  # what its end alone frees (a model's weights other tasks share stay)
    # its model's weights shared with other running tasks on its worker (0: none shares
    # them), and how many running tasks there share them: the ends of all of them free those too
    model: str = ""
    shared_gb: float = 0.0
    sharers: int = 1
    handlers: frozenset[str] | None = None  # its worker's app's (runs); None: not published

    @property
    def ends_ms(self) -> int:
        return self.started_ms + int(self.est_s * 1000)


@dataclass(frozen=True)
class Option:
    """Victims on one worker whose ends together make room for a waiting task: one, or,
    where no one of them frees enough (a group or a worker with several slots running
    several tasks), the fewest that do, soonest-ending first."""

    victims: tuple[Victim, ...]

    @property
    def worker(self) -> str:
        return self.victims[0].worker

    @property
    def ends_ms(self) -> int:  # the room is there once the last of them ends
        return max(v.ends_ms for v in self.victims)


class Idle(NamedTuple):
    """An idle worker as the planner weighs it: one of a shape, or, with ``skips``, one worker."""

    gb: float  # claimable VRAM
    levels: str
    gpus: int = 1
    # (model, end ms) of the models its claims skip (its `lanes` entry: gpuq.worker.broken)
    skips: tuple[tuple[str, int], ...] = ()
    handlers: frozenset[str] | None = None  # its app's (runs); None: not published

    def takes(self, w: Waiting, now_ms: int | None = None) -> bool:
        """Whether it could claim ``w``, cold if need be: not while it skips w's model at
        now_ms (None: a skip listed counts), nor if its app lacks w's handler."""
        return (self.gb >= w.need_gb and str(w.priority) in self.levels and self.gpus >= w.gpus
                and runs(self.handlers, w.handler)
                and not any(m == w.model and (now_ms is None or end > now_ms) for m, end in self.skips))


def runs(handlers: frozenset[str] | None, handler: str) -> bool:
    """Whether a worker whose app runs ``handlers`` runs ``handler``: one that does not
    passes the task on unrun, or fails it where no live worker runs it (a typo), so no room
    is planned or waited for there."""
    return handlers is None or not handler or handler in handlers


SKIPS_READ = 8  # idle workers of a shape whose skips are read (the wake rule's tightest reads 8)


def idle_to_read(shapes: Mapping[Idle, Sequence[str]], waiting: Iterable[Waiting]) -> list[str]:
    """The idle workers whose skips the plan reads: up to SKIPS_READ of each shape (its
    workers, in `idle` order) that could claim one of ``waiting``; no other shape's answer
    depends on them. Skips are rare: reading every idle worker's would cost each round."""
    heads = list(waiting)
    return [n for shape, names in shapes.items() if any(shape.takes(w) for w in heads)
            for n in names[:SKIPS_READ]]


def split_idle(shapes: Mapping[Idle, Sequence[str]], skips: Mapping[str, dict[str, int]]) -> list[Idle]:
    """The idle shapes with their workers' skips (``skips``: the workers read, each with its
    models' ends): a worker that skips some model is an Idle of its own; its shape stays
    while any of its workers skips none or was not read."""
    out: dict[Idle, None] = {}
    for shape, names in shapes.items():
        listed = [skips[n] for n in names if skips.get(n)]
        if len(listed) < len(names):
            out[shape] = None
        for ends in listed:
            out[shape._replace(skips=tuple(sorted(ends.items())))] = None
    return list(out)


def candidates_for(w: Waiting, victims: list[Victim], idle: list[Idle],
                   used: set[str], limit: Limits | None = None,
                   askable: Callable[[Victim], bool] | None = None,
                   now_ms: int | None = None) -> list[Option]:
    """The options that could make room for ``w``: each victim whose end alone does, and on
    a worker where none does, the fewest of its victims that together do (not for a task
    whose tenant has limits: what several ends give back is not weighed); while an idle
    worker could claim it (and load its model cold), only those on the busy holder of its
    model it was offered to; while its tenant is at a limit, only its own tenant's victims
    whose end lets it start. askable: which victims may be asked to yield; where a worker's
    set includes one that may not, the fewest of those that may are an option too. A worker
    skipping w's model at now_ms (None: any listed) offers none: it would pass w on unloaded;
    an idle one skipping it would not claim it. Nor does one whose app lacks w's handler."""
    skipping = w.skipped_on(now_ms) if w.skipped_by else ()
    eligible = [v for v in victims if v.priority > w.priority and v.worker not in used
                and str(w.priority) in v.levels and v.gpus >= w.gpus and v.worker not in skipping
                and runs(v.handlers, w.handler)]
    fits = [Option((v,)) for v in eligible if v.room_gb >= w.need_gb]
    if limit is not None and limit.over(w.need_gb, w.gpus):
        return [o for o in fits if own_charge(w, o.victims[0])
                and not limit.after(o.victims[0].charge).over(w.need_gb, w.gpus)]
    if limit is None:
        fits += together(w, eligible, {o.worker for o in fits}, askable)
    if idle_fits(w, idle, now_ms):
        return [o for o in fits if o.worker == w.offered]
    return fits


def together(w: Waiting, eligible: list[Victim], served: set[str],
             askable: Callable[[Victim], bool] | None = None) -> list[Option]:
    """Per worker no one of whose victims makes room for ``w`` alone: its victims, soonest
    end first, up to the first whose ends together do (each frees its own; the room is what
    the first's end leaves plus what the others free). Where that set holds a victim that
    may not be asked (``askable``), also the same of the victims that may: a victim at
    ``preempt_max`` ending first must not keep the others from being asked."""
    by_worker: dict[str, list[Victim]] = {}
    for v in sorted(eligible, key=lambda v: v.ends_ms):
        if v.worker not in served:
            by_worker.setdefault(v.worker, []).append(v)
    out = []
    for mine in by_worker.values():
        first = fewest(w, mine)
        if first is not None:
            out.append(first)
        if askable is not None and (first is None or not all(askable(v) for v in first.victims)):
            if (asked := fewest(w, [v for v in mine if askable(v)])) is not None:
                out.append(asked)
    return out


def fewest(w: Waiting, mine: list[Victim]) -> Option | None:
    """The first two or more of ``mine`` (one worker's, soonest end first) whose ends
    together make room for ``w``."""
    room = mine[0].room_gb if mine else 0.0
    ending: dict[str, int] = {}  # model -> its sharers in the set so far
    if mine and mine[0].shared_gb:
        ending[mine[0].model] = 1
    for k in range(1, len(mine)):
        v = mine[k]
        room += v.freed_gb
        if v.shared_gb:
            ending[v.model] = ending.get(v.model, 0) + 1
            if ending[v.model] == v.sharers:  # the last task of its model here: weights free too
                room += v.shared_gb
        if room >= w.need_gb:
            return Option(tuple(mine[:k + 1]))
    return None


def own_charge(w: Waiting, v: Victim) -> bool:  # v counts against the limits of w's tenant
    return v.charge is not None and v.charge[0] == w.tenant


def idle_takes(w: Waiting, idle: list[Idle], limit: Limits | None, now_ms: int | None = None) -> bool:
    """Whether an idle worker would claim ``w`` at now_ms (its tenant within its limits)."""
    return idle_fits(w, idle, now_ms) and not (limit is not None and limit.over(w.need_gb, w.gpus))


def idle_fits(w: Waiting, idle: list[Idle], now_ms: int | None = None) -> bool:
    """Whether an idle worker could claim ``w`` at now_ms, cold if need be."""
    return any(i.takes(w, now_ms) for i in idle)


def may_be_asked(v: Victim, config: Config, now_ms: int) -> bool:
    """Whether ``v`` may be asked to yield: it has run its minimum and was preempted fewer
    than ``preempt_max`` times."""
    return ran_minimum(v, config, now_ms) and v.preemptions < config.preempt_max


def ran_minimum(v: Victim, config: Config, now_ms: int) -> bool:
    """Whether ``v`` has run ``preempt_min_runtime_s`` at now_ms."""
    return (now_ms - v.started_ms) / 1000 >= config.preempt_min_runtime_s


def of_age(victims: tuple[Victim, ...], config: Config) -> int:
    """When (ms) every one of ``victims`` has run its minimum: the planner's own test
    (ran_minimum), from just below the minimum runtime (float-safe)."""
    t = max(v.started_ms for v in victims) + int(config.preempt_min_runtime_s * 1000) - 2
    while not all(ran_minimum(v, config, t) for v in victims):
        t += 1
    return t


def askable_at(options: Iterable[Option], config: Config) -> float:
    """The first time (ms) one of ``options`` may be asked to yield: once the youngest of
    its victims ran its minimum (of_age), if none was preempted ``preempt_max`` times; inf:
    never."""
    return min((of_age(o.victims, config) for o in options
                if all(v.preemptions < config.preempt_max for v in o.victims)), default=math.inf)
