"""Script replies: the code table every script's first element uses, and the one place a
code becomes an exception."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from enum import IntEnum
from importlib import resources
from typing import Any

from gpuq.errors import (
    DuplicateTask,
    GpuqError,
    InvalidTask,
    StaleLease,
    TaskAlreadyFinished,
    TaskNotFound,
    UnregisteredHandler,
    Unschedulable,
)
from gpuq.task import MAX_GPUS


class Code(IntEnum):
    """First element of every script reply (documented in each script's header)."""

    OK = 0
    INVALID = 1
    DUPLICATE = 2
    UNSCHEDULABLE = 3
    NOT_FOUND = 4
    STALE_LEASE = 5
    FINISHED = 6
    UNREGISTERED = 7


def header_codes(name: str) -> set[str]:
    """Error-code names a script's header promises (checked against Code by the tests)."""
    text = (resources.files("gpuq") / "lua" / f"{name}.lua").read_text()
    errors = "|".join(c.name for c in Code if c is not Code.OK)
    return set(re.findall(rf"\b({errors})\b", text))


def raise_for(reply: Sequence[Any], task_id: str | None = None, worker_id: str | None = None,
              index: int | None = None) -> None:
    """Map a non-OK reply to its exception: the one place codes become errors. index: the
    task's place in its bulk (0-based), said in the message: a caller whose ids gpuq made
    never saw them."""
    if reply[0] == 0:  # OK, the common case: no enum to build (a worker settles each task)
        return
    code = Code(int(reply[0]))
    tid = task_id or ""
    where = "" if index is None else f"task {index} of the batch: "
    if code is Code.OK:
        return
    if code is Code.INVALID:
        raise InvalidTask(where + str(reply[2]), task_id)
    if code is Code.DUPLICATE:
        raise DuplicateTask(str(reply[2]))
    if code is Code.UNSCHEDULABLE:
        raise Unschedulable(float(reply[2]), float(reply[3]), *(_gpus(x) for x in reply[4:6]), where=where)
    if code is Code.UNREGISTERED:
        raise UnregisteredHandler(str(reply[2]), where=where)
    if code is Code.NOT_FOUND:
        raise TaskNotFound(tid)
    if code is Code.STALE_LEASE:
        raise StaleLease(tid, worker_id)
    if code is Code.FINISHED:
        raise TaskAlreadyFinished(tid, str(reply[1]))
    raise GpuqError(f"unexpected script reply {reply!r}")  # pragma: no cover


def _gpus(text: Any) -> int:
    """A GPU count of an UNSCHEDULABLE reply: a class's damaged "inf" (or "nan") reads as a
    group of the most GPUs a worker may have."""
    number = float(text)
    return int(number) if math.isfinite(number) else MAX_GPUS


def checked(reply: list[Any]) -> list[Any]:
    """The reply of a script whose callers expect OK: a coded error (a malformed argument,
    INVALID) raised instead of misread."""
    raise_for(reply)
    return reply


def pairs_to_dict(flat: Sequence[Any]) -> dict[str, str]:
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


def hash_reply(reply: Any) -> dict[str, str]:
    """A raw HGETALL reply as a dict: a map under RESP3, a flat list under RESP2."""
    return reply if isinstance(reply, dict) else pairs_to_dict(reply)


def scored(reply: Sequence[Any]) -> Sequence[Any]:
    """A raw ``... WITHSCORES`` reply as (member, score) pairs: RESP2 sends them flat,
    RESP3 already paired."""
    if reply and not isinstance(reply[0], (list, tuple)):
        return list(zip(reply[0::2], reply[1::2]))
    return reply
