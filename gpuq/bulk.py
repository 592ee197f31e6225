"""A bulk enqueue larger than one call: the pool's state checked first, a failure told whole.

One enqueue.lua call is atomic, but a bulk enqueue of more than ``BULK_CHUNK`` tasks is
several calls (each bounds how long the server runs one script, so online claims do not
wait behind a large bulk). So that a rejection of a later chunk cannot leave the first ones
written, such a bulk first asks, in one round trip, what enqueue.lua would refuse for the
pool's state as it is: ids already taken, parents unknown or ended other than succeeded
(without ``after_any_outcome``), an ``at`` in the past by the server's clock, tenants
unregistered in a pool that requires them (``preflight``). What can still fail a later chunk
(another producer taking an id or ending a parent meanwhile, a server out of memory, a
``check_fit`` class or handler) is told by ``PartialEnqueue``, with the tasks that were
enqueued (``written``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuq.clock import from_time_reply
from gpuq.errors import DuplicateTask, InvalidTask
from gpuq.keys import REQUIRED, Keys
from gpuq.task import TaskSpec

BULK_CHUNK = 200  # tasks per enqueue call in a bulk enqueue
_ENDED_BADLY = ("failed", "expired", "canceled")


def preflight(keys: Keys, specs: Sequence[TaskSpec]) -> list[tuple[Any, ...]]:
    """The commands whose replies ``check`` reads: one EXISTS of every id, the server's TIME,
    the tenants policy with each tenant's entry, and the state of each parent stored."""
    batch = {s.task_id for s in specs}
    tenants = sorted({s.tenant for s in specs})
    parents = sorted({p for s in specs for p in s.after if p not in batch})
    return [("EXISTS", *(keys.task(s.task_id) for s in specs)), ("TIME",),
            ("HMGET", keys.tenants, REQUIRED, *tenants),
            *(("HGET", keys.task(p), "state") for p in parents)]


def check(specs: Sequence[TaskSpec], replies: Sequence[Any]) -> bool:
    """Raise what enqueue.lua would for the state ``preflight`` read, the first task first;
    True when an id is taken (which one: ``taken``, one more round trip)."""
    taken, now_ms, policy, states = replies[0], from_time_reply(replies[1]), replies[2], replies[3:]
    batch = {s.task_id: i for i, s in enumerate(specs)}
    parents = sorted({p for s in specs for p in s.after if p not in batch})
    state_of = dict(zip(parents, states))
    required = policy[0] == "1"
    registered = dict(zip(sorted({s.tenant for s in specs}), policy[1:]))
    for i, s in enumerate(specs):
        if required and registered[s.tenant] is None:
            raise InvalidTask(f"tenant {s.tenant} is not registered (this pool requires it: "
                              "gpuq tenant set)", s.task_id)
        if s.at is not None and int(s.at * 1000) < now_ms:
            raise InvalidTask(f"at is in the past: {int(s.at * 1000)} < server time {now_ms}", s.task_id)
        for p in s.after:
            if p == s.task_id:
                raise InvalidTask("a task cannot wait for itself", s.task_id)
            state = "queued" if batch.get(p, i) < i else state_of.get(p)
            if state is None:
                raise InvalidTask(f"unknown parent task {p}", s.task_id)
            if state in _ENDED_BADLY and not s.after_any_outcome:
                raise InvalidTask(f"parent task {p} ended {state}", s.task_id)
    return int(taken) > 0


def exists_each(keys: Keys, specs: Sequence[TaskSpec]) -> list[tuple[Any, ...]]:
    """One EXISTS per task: which of them the server holds."""
    return [("EXISTS", keys.task(s.task_id)) for s in specs]


def taken(specs: Sequence[TaskSpec], replies: Sequence[Any]) -> None:
    """DuplicateTask for the first task whose id the server holds (``exists_each``)."""
    for s, there in zip(specs, replies):
        if int(there):
            raise DuplicateTask(s.task_id)


def written(specs: Sequence[TaskSpec], replies: Sequence[Any]) -> list[TaskSpec]:
    """The tasks ``exists_each`` found stored: those a failed bulk enqueued before it stopped."""
    return [s for s, there in zip(specs, replies) if int(there)]
