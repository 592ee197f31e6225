"""A bulk enqueue larger than one call: the pool's state checked first, a failure told whole.

One enqueue.lua call is atomic, but a bulk enqueue of more than ``BULK_CHUNK`` tasks is
several calls (each bounds how long the server runs one script, so online claims do not
wait behind a large bulk). So that a rejection of a later chunk cannot leave the first ones
written, such a bulk first asks, in one round trip, what enqueue.lua would refuse for the
pool's state as it is: ids already taken, parents unknown or ended other than succeeded
(without ``after_any_outcome``), an ``at`` in the past by the server's clock, tenants
unregistered in a pool that requires them, tasks past their tenant's caps, and with
``check_fit`` tasks no registered class holds or whose handler none registered
(``Preflight``). What can still fail a later chunk (another producer taking an id, ending a
parent, changing a tenant or registering meanwhile, a server out of memory) is told by
``PartialEnqueue``, with the tasks that were enqueued (``outcome``): those of the calls
whose reply says they wrote (``written``; a call is all or nothing), not whatever ids the
server holds, which another producer enqueueing the same ids may have written. Only when
the connection failed before the replies were read are the ids looked up (``exists_each``),
and then a task another producer stored is named too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from gpuq.clock import from_time_reply
from gpuq.errors import DuplicateTask, InvalidTask, PartialEnqueue, UnregisteredHandler, Unschedulable
from gpuq.joined import wrote
from gpuq.keys import REQUIRED, Keys
from gpuq.replies import hash_reply
from gpuq.task import MAX_GPUS, TaskSpec
from gpuq.tenants import Tenant

BULK_CHUNK = 200  # tasks per enqueue call in a bulk enqueue
_ENDED_BADLY = ("failed", "expired", "canceled")


class Preflight:
    """What a bulk's tasks name that the pool's state decides: their tenants, the parents
    not in the bulk, and with ``check_fit`` the GPU classes and handlers registered;
    ``commands`` reads that state, ``check`` judges its replies."""

    def __init__(self, specs: Sequence[TaskSpec], check_fit: bool = False) -> None:
        self.specs = specs
        self.position = {s.task_id: i for i, s in enumerate(specs)}
        self.tenants = sorted({s.tenant for s in specs})
        self.parents = sorted({p for s in specs for p in s.after if p not in self.position})
        self.handlers = sorted({s.handler for s in specs}) if check_fit else []

    def commands(self, keys: Keys) -> list[tuple[Any, ...]]:
        """One EXISTS of every id, the server's TIME, the tenants policy with each tenant's
        entry, the state of each parent stored, and with check_fit the classes, their GPUs
        and which handlers are registered."""
        fit = [("HGETALL", keys.classes), ("HGETALL", keys.class_gpus),
               ("SMISMEMBER", keys.handlers, *self.handlers)] if self.handlers else []
        return [("EXISTS", *(keys.task(s.task_id) for s in self.specs)), ("TIME",),
                ("HMGET", keys.tenants, REQUIRED, *self.tenants),
                *(("HGET", keys.task(p), "state") for p in self.parents), *fit]

    def check(self, replies: Sequence[Any]) -> bool:
        """Raise what enqueue.lua would for the state ``commands`` read, the first task
        first; True when an id is taken (which one: ``taken``, one more round trip)."""
        taken, now_ms, policy = replies[0], from_time_reply(replies[1]), replies[2]
        state_of = dict(zip(self.parents, replies[3:3 + len(self.parents)]))
        registered = dict(zip(self.tenants, policy[1:]))
        caps = {t: Tenant.parse(t, v) for t, v in registered.items() if isinstance(v, str)}
        fits = Fits(self.handlers, replies[3 + len(self.parents):]) if self.handlers else None
        for i, s in enumerate(self.specs):
            _refused(s, i, policy[0] == "1" and registered[s.tenant] is None, now_ms,
                     self.position, state_of)
            if fits is not None:
                fits.check(i, s)
            if (terms := caps.get(s.tenant)) is not None and (why := terms.past_caps(s.gpus, s.vram_gb)):
                raise _at(i, s, why)
        return int(taken) > 0


class Fits:
    """check_fit's refusals (enqueue.lua's), from the registered classes (usable VRAM), the
    GPUs of their groups and whether each handler was ever registered: a bulk of several
    calls refuses an unfit task whole, whichever chunk holds it (each chunk's call would
    refuse only its own, the others stored)."""

    def __init__(self, handlers: Sequence[str], replies: Sequence[Any]) -> None:
        classes, counts, known = hash_reply(replies[0]), hash_reply(replies[1]), replies[2]
        # as enqueue.lua reads them: a class's GB finite or 0; its GPUs as written (0 holds
        # nothing), 1 where unlisted or not a number
        self.shapes = [(_number(gb), _count(counts.get(name))) for name, gb in classes.items()]
        most = max((g for _, g in self.shapes), default=0.0)
        self.most_gpus = int(most) if math.isfinite(most) else MAX_GPUS
        self.registered = {h: bool(int(k)) for h, k in zip(handlers, known)}

    def check(self, i: int, s: TaskSpec) -> None:
        where = f"task {i} of the batch: "
        largest = max((gb for gb, g in self.shapes if g >= s.gpus), default=0.0)
        if s.vram_gb > largest:
            raise Unschedulable(s.vram_gb, largest, s.gpus, self.most_gpus, where=where)
        if not self.registered[s.handler]:
            raise UnregisteredHandler(s.handler, where=where)


def _count(text: str | None) -> float:
    """A class's GPUs as enqueue.lua reads them (``tonumber(...) or 1``)."""
    try:
        number = float(text) if text is not None else 1.0
    except ValueError:
        return 1.0
    return 1.0 if math.isnan(number) else number


def _number(text: str) -> float:
    """A stored number as lib/args.lua's finite() reads it; a damaged one (text, inf, nan)
    as 0."""
    try:
        number = float(text)
    except ValueError:
        return 0.0
    return number if math.isfinite(number) else 0.0


def _refused(s: TaskSpec, i: int, unregistered: bool, now_ms: int, position: dict[str, int],
             state_of: dict[str, Any]) -> None:
    """InvalidTask for what enqueue.lua would refuse of task ``s``, at ``i`` in its bulk."""
    if unregistered:
        raise _at(i, s, f"tenant {s.tenant} is not registered (this pool requires it: gpuq tenant set)")
    if s.at is not None and int(s.at * 1000) < now_ms:
        raise _at(i, s, f"at is in the past: {int(s.at * 1000) / 1000:.3f} < server time "
                        f"{now_ms / 1000:.3f} (epoch s)")
    for p in s.after:
        if p == s.task_id:
            raise _at(i, s, "a task cannot wait for itself")
        state = "queued" if position.get(p, i) < i else state_of.get(p)
        if state is None:
            raise _at(i, s, f"unknown parent task {p}")
        if state in _ENDED_BADLY and not s.after_any_outcome:
            raise _at(i, s, f"parent task {p} ended {state}")


def _at(i: int, s: TaskSpec, why: str) -> InvalidTask:
    """The refusal of task ``s``, at ``i`` in its bulk, naming its place (a caller whose ids
    gpuq made never saw them), as the scripts' refusals do."""
    return InvalidTask(f"task {i} of the batch: {why}", s.task_id)


def written(specs: Sequence[TaskSpec], replies: Sequence[Any]) -> list[bool] | None:
    """Per task, whether the reply of its call (BULK_CHUNK tasks each, in order) says it
    wrote; None without a reply for every call (the connection failed before they were
    read)."""
    calls = -(-len(specs) // BULK_CHUNK)
    if len(replies) < calls:
        return None
    return [wrote(replies[i // BULK_CHUNK]) for i in range(len(specs))]


def exists_each(keys: Keys, specs: Sequence[TaskSpec]) -> list[tuple[Any, ...]]:
    """One EXISTS per task: which of them the server holds."""
    return [("EXISTS", keys.task(s.task_id)) for s in specs]


def taken(specs: Sequence[TaskSpec], replies: Sequence[Any]) -> None:
    """DuplicateTask for the first task whose id the server holds (``exists_each``)."""
    for s, there in zip(specs, replies):
        if int(there):
            raise DuplicateTask(s.task_id)


def outcome(specs: Sequence[TaskSpec], replies: Sequence[Any], cause: Exception,
            handle: Callable[[str], Any]) -> Exception:
    """What a failed bulk raises: PartialEnqueue with a handle of each task ``replies`` says
    is stored (``written``, else ``exists_each``), or ``cause`` when none was."""
    stored = [handle(s.task_id) for s, there in zip(specs, replies) if int(there)]
    return PartialEnqueue(stored, len(specs), cause) if stored else cause
