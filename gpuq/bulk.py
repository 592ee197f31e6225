"""A bulk enqueue larger than one call: the pool's state checked first, a failure told whole.

One enqueue.lua call is atomic, but a bulk enqueue of more than ``BULK_CHUNK`` tasks is
several calls (each bounds how long the server runs one script, so online claims do not
wait behind a large bulk). So that a rejection of a later chunk cannot leave the first ones
written, such a bulk first asks, in one round trip, what enqueue.lua would refuse for the
pool's state as it is: ids already taken, parents unknown or ended other than succeeded
(without ``after_any_outcome``), an ``at`` in the past by the server's clock, tenants
unregistered in a pool that requires them, tasks past their tenant's caps (``Preflight``).
What can still fail a later chunk (another producer taking an id, ending a parent or
changing a tenant meanwhile, a server out of memory, a ``check_fit`` class or handler) is
told by ``PartialEnqueue``, with the tasks that were enqueued (``outcome``): those of the
calls whose reply says they wrote (``written``; a call is all or nothing), not whatever ids
the server holds, which another producer enqueueing the same ids may have written. Only
when the connection failed before the replies were read are the ids looked up
(``exists_each``), and then a task another producer stored is named too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpuq.clock import from_time_reply
from gpuq.errors import DuplicateTask, InvalidTask, PartialEnqueue
from gpuq.joined import wrote
from gpuq.keys import REQUIRED, Keys
from gpuq.task import TaskSpec
from gpuq.tenants import Tenant

BULK_CHUNK = 200  # tasks per enqueue call in a bulk enqueue
_ENDED_BADLY = ("failed", "expired", "canceled")


class Preflight:
    """What a bulk's tasks name that the pool's state decides: their tenants, and the parents
    not in the bulk; ``commands`` reads that state, ``check`` judges its replies."""

    def __init__(self, specs: Sequence[TaskSpec]) -> None:
        self.specs = specs
        self.position = {s.task_id: i for i, s in enumerate(specs)}
        self.tenants = sorted({s.tenant for s in specs})
        self.parents = sorted({p for s in specs for p in s.after if p not in self.position})

    def commands(self, keys: Keys) -> list[tuple[Any, ...]]:
        """One EXISTS of every id, the server's TIME, the tenants policy with each tenant's
        entry, and the state of each parent stored."""
        return [("EXISTS", *(keys.task(s.task_id) for s in self.specs)), ("TIME",),
                ("HMGET", keys.tenants, REQUIRED, *self.tenants),
                *(("HGET", keys.task(p), "state") for p in self.parents)]

    def check(self, replies: Sequence[Any]) -> bool:
        """Raise what enqueue.lua would for the state ``commands`` read, the first task
        first; True when an id is taken (which one: ``taken``, one more round trip)."""
        taken, now_ms, policy = replies[0], from_time_reply(replies[1]), replies[2]
        state_of = dict(zip(self.parents, replies[3:]))
        registered = dict(zip(self.tenants, policy[1:]))
        caps = {t: Tenant.parse(t, v) for t, v in registered.items() if isinstance(v, str)}
        for i, s in enumerate(self.specs):
            _refused(s, i, policy[0] == "1" and registered[s.tenant] is None, now_ms,
                     self.position, state_of)
            if (terms := caps.get(s.tenant)) is not None and (why := terms.past_caps(s.gpus, s.vram_gb)):
                raise InvalidTask(why, s.task_id)
        return int(taken) > 0


def _refused(s: TaskSpec, i: int, unregistered: bool, now_ms: int, position: dict[str, int],
             state_of: dict[str, Any]) -> None:
    """InvalidTask for what enqueue.lua would refuse of task ``s``, at ``i`` in its bulk."""
    if unregistered:
        raise InvalidTask(f"tenant {s.tenant} is not registered (this pool requires it: "
                          "gpuq tenant set)", s.task_id)
    if s.at is not None and int(s.at * 1000) < now_ms:
        raise InvalidTask(f"at is in the past: {int(s.at * 1000) / 1000:.3f} < server time "
                          f"{now_ms / 1000:.3f} (epoch s)", s.task_id)
    for p in s.after:
        if p == s.task_id:
            raise InvalidTask("a task cannot wait for itself", s.task_id)
        state = "queued" if position.get(p, i) < i else state_of.get(p)
        if state is None:
            raise InvalidTask(f"unknown parent task {p}", s.task_id)
        if state in _ENDED_BADLY and not s.after_any_outcome:
            raise InvalidTask(f"parent task {p} ended {state}", s.task_id)


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
