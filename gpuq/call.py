"""A script call: the script's name, its arguments, the parser of its reply and the replicas
its write must reach. ``gpuq.calls.Calls`` builds one per verb; ``gpuq.scripts.Scripts`` and
``gpuq.aio`` run them. Immutable, and a tuple: a worker builds two a task, and a frozen
dataclass's fields are each set through ``object.__setattr__`` (3x a tuple's build)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Replicas:
    """A write's WAIT: the replicas that must acknowledge it and for how long to wait; a
    strict one (a producer's enqueue) raises ReplicaTimeout when fewer do, another (a
    worker's ack, fail or requeue) is logged: it is on the master, and were it lost, the
    task's lease would run out and the task run again."""

    count: int
    timeout_ms: int
    strict: bool
    what: str


class Call(NamedTuple, Generic[T]):
    script: str
    args: list[str]
    parse: Callable[[list[Any]], T]
    replicas: Replicas | None = None  # send WAIT after it (Config.replica_acks)
