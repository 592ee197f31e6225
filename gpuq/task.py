"""The task record: priorities, states, and validation at the boundary.

A task lives in Redis as a hash of plain string fields (docs/PROTOCOL.md). This module
turns caller input into those fields, rejecting bad input before anything is written, and
turns a stored hash back into a typed record.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, NamedTuple

from gpuq.errors import CorruptTask, DuplicateTask, InvalidTask
from gpuq.names import name_problem

MAX_PAYLOAD_BYTES = 1 << 20  # 1 MiB: a task carries parameters, not tensors
MAX_RESULT_BYTES = 1 << 20  # 1 MiB: results too (ack.lua refuses larger); outputs go to storage
MAX_CHECKPOINT_BYTES = 1 << 20  # and a checkpoint (requeue.lua refuses larger)
# strict, compact JSON for payloads and results; one encoder (json.dumps with options
# would build a new one per call, a third of a bulk enqueue's client time); it escapes every
# non-ASCII character, so a text's length is its size in bytes
JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
MAX_GPUS = 64  # devices a task may run across (enqueue.lua refuses more)
MAX_SECONDS = 1e10  # est_s and deadline_s at most (enqueue.lua's bounds: about 300 years)
MAX_VRAM_GB = 1e6  # a task's VRAM over all its GPUs at most: a petabyte is no task's


class Priority(IntEnum):
    P0 = 0  # online
    P1 = 1  # nearline
    P2 = 2  # batch
    P3 = 3  # offline

    @property
    def label(self) -> str:
        return f"P{int(self)}"

    @classmethod
    def parse(cls, value: object) -> Priority:
        """Accept P0..P3, 0..3, and the names online/nearline/batch/offline."""
        if isinstance(value, Priority):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3:
            return cls(value)
        if isinstance(value, str):
            text = value.strip().lower()
            if text in _PRIORITY_NAMES:
                return cls(_PRIORITY_NAMES[text])
        raise InvalidTask(f"unknown priority {value!r} (use P0..P3, 0..3 or online/nearline/batch/offline)")


_PRIORITY_NAMES = {
    **{f"p{i}": i for i in range(4)},
    **{str(i): i for i in range(4)},
    "online": 0,
    "nearline": 1,
    "batch": 2,
    "offline": 3,
}


class State(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DELAYED = "delayed"  # due later: a retry waiting out its backoff, or enqueued with a delay
    WAITING = "waiting"  # enqueued with `after`: waits for its parent tasks to end
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELED = "canceled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({State.SUCCEEDED, State.FAILED, State.EXPIRED, State.CANCELED})


def ended_count(stats: Mapping[Any, Any], state: str) -> int:
    """Tasks that ended in ``state``, from the pool's `stats` hash: the sum of its counts per
    priority (``<state>:P<n>``) and of those without a readable one (``<state>:unleveled``,
    corrupt hashes). A task ending adds one count, not a total beside it (lib/finish.lua)."""
    return sum(int(stats.get(f"{state}:{k}", 0)) for k in ("P0", "P1", "P2", "P3", "unleveled"))


_issued = itertools.count()


def new_task_id() -> str:
    """32 hex digits: this host's clock in ms (12), a per-process count (6), 56 random bits
    (14). Tasks of one queue enqueued in the same millisecond share a score, and a sorted set
    orders equal scores by member: ids that grow in creation order keep a bulk enqueue's
    tasks, and a producer's same-millisecond enqueues, in the order they were made. The
    random bits come from the random module's generator, seeded from the OS and reseeded in
    a forked child (so two forks of one producer do not repeat each other's ids)."""
    ms = time.time_ns() // 1_000_000
    return f"{ms & 0xFFFFFFFFFFFF:012x}{next(_issued) & 0xFFFFFF:06x}{random.getrandbits(56):014x}"


def positive_number(name: str, value: object, *, allow_zero: bool = False,
                     most: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTask(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range
        number = math.inf
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero) or number > most:
        bound = ">= 0" if allow_zero else "> 0"
        upto = f" and at most {most:g}".replace("e+0", "e").replace("e+", "e") if most < math.inf else ""
        raise InvalidTask(f"{name} must be a finite number {bound}{upto}, got {value!r}")
    return number


_good_names: set[str] = set()  # handler, model and tenant names repeat: check each once


def _name(field: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidTask(f"{field} must be a non-empty string")
    if value in _good_names:
        return value
    if problem := name_problem(value):
        raise InvalidTask(f"{field} {problem}")
    if field not in ("task_id", "parent id"):  # ids are one-off
        if len(_good_names) >= 4096:
            _good_names.clear()
        _good_names.add(value)
    return value


def encode_payload(payload: object) -> str:
    """Serialize a payload (any JSON-serializable value; a str becomes a JSON string)."""
    if isinstance(payload, (bytes, bytearray)):
        raise InvalidTask("payload must be JSON-serializable data, not bytes")
    try:
        text = JSON.encode(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidTask(f"payload is not JSON-serializable: {exc}") from None
    if len(text) > MAX_PAYLOAD_BYTES:  # JSON escapes non-ASCII: one byte per character
        raise InvalidTask(f"payload is larger than {MAX_PAYLOAD_BYTES} bytes")
    return text


def parse_payload_text(text: str) -> Any:
    """Parse JSON text given on a command line; one clear error when it is malformed."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidTask(f"payload is not valid JSON: {exc.msg} at position {exc.pos}") from None
    except (ValueError, RecursionError) as exc:  # an integer past 4300 digits; nested too deep
        raise InvalidTask(f"payload is not usable JSON: {exc}") from None


class TaskSpec(NamedTuple):
    """What a producer asks for, validated by ``build``. A named tuple rather than a frozen
    dataclass: as immutable, and built three times faster (a bulk enqueue builds one per
    task before it sends any)."""

    handler: str
    payload: str  # JSON text
    model: str
    vram_gb: float
    priority: Priority
    est_s: float | None = None  # None: the pool's learned mean for its handler and model, else 1
    deadline_s: float | None = None  # relative to enqueue; stored as an absolute deadline
    preemptible: bool = True
    tenant: str = "default"
    max_attempts: int = 3
    task_id: str = ""
    report_end: bool = False  # list it in `ended` if it ends other than succeeded (rq bridge)
    gpus: int = 1  # devices it runs across (tensor parallel); vram_gb is its need over all of them
    delay_s: float | None = None  # queued this many seconds after enqueue (server clock)
    at: float | None = None  # or queued at this epoch time (seconds)
    after: tuple[str, ...] = ()  # parent task ids: queued once every one succeeded
    after_any_outcome: bool = False  # queued once every parent ended, however it ended

    @classmethod
    def build(
        cls,
        handler: str,
        payload: object = None,
        *,
        model: str,
        vram_gb: float,
        priority: object = Priority.P2,
        est_s: float | None = None,
        deadline_s: float | None = None,
        preemptible: bool = True,
        tenant: str = "default",
        max_attempts: int = 3,
        task_id: str | None = None,
        report_end: bool = False,
        gpus: int = 1,
        delay_s: float | None = None,
        at: float | None = None,
        after: Iterable[str] | str = (),
        after_any_outcome: bool = False,
    ) -> TaskSpec:
        delay_s, at, parents = _deferral(delay_s, at, after)
        if after_any_outcome and not parents:  # as the CLI refuses it: it would do nothing
            raise InvalidTask("after_any_outcome needs after (the parent tasks it waits for)")
        if deadline_s is not None:  # enqueue.lua takes at most 1e13 ms (about 300 years)
            deadline_s = positive_number("deadline_s", deadline_s, most=MAX_SECONDS)
            if isinstance(est_s, (int, float)) and est_s > deadline_s:  # as enqueue.lua refuses it
                raise InvalidTask(f"deadline_s {deadline_s:g} is shorter than est_s {est_s:g}: "
                                  "it cannot end in time")
        if type(max_attempts) is not int or not 1 <= max_attempts <= 100:  # a bool is no int here
            raise InvalidTask(f"max_attempts must be an integer in 1..100, got {max_attempts!r}")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= MAX_GPUS:
            raise InvalidTask(f"gpus must be an integer in 1..{MAX_GPUS}, got {gpus!r}")
        return cls(
            handler=_name("handler", handler),
            payload=encode_payload(payload),
            model=_name("model", model),
            vram_gb=positive_number("vram_gb", vram_gb, most=MAX_VRAM_GB),
            priority=Priority.parse(priority),
            est_s=None if est_s is None else positive_number("est_s", est_s, allow_zero=True,
                                                              most=MAX_SECONDS),
            deadline_s=None if deadline_s is None else float(deadline_s),
            preemptible=_flag("preemptible", preemptible),
            tenant=_name("tenant", tenant),
            max_attempts=max_attempts,
            task_id=_name("task_id", task_id) if task_id is not None else new_task_id(),
            report_end=_flag("report_end", report_end),
            gpus=gpus,
            delay_s=delay_s,
            at=at,
            after=parents,
            after_any_outcome=_flag("after_any_outcome", after_any_outcome),
        )


MAX_PARENTS = 100  # ids in one task's `after`


def _flag(name: str, value: object) -> bool:
    """A yes/no option: a bool (or 0/1); a text such as "no" would read as true."""
    if value in (True, False):  # 0 and 1 compare equal to them
        return bool(value)
    raise InvalidTask(f"{name} must be True or False, got {value!r}")


def _deferral(delay_s: object, at: object,
              after: Iterable[str] | str) -> tuple[float | None, float | None, tuple[str, ...]]:
    """A task's delay (or due time) and parents, checked: one of delay_s and at, neither
    negative, and not with parents (a child is queued when its parents end). Whether ``at``
    is in the past is decided by the server's clock, at enqueue."""
    if delay_s is not None and at is not None:
        raise InvalidTask("give delay_s or at, not both")
    delay = None if delay_s is None else positive_number("delay_s", delay_s, allow_zero=True)
    when = None if at is None else positive_number("at", at)
    if delay is not None and delay > 1e10:
        raise InvalidTask(f"delay_s must be at most 1e10 seconds, got {delay_s!r}")
    if when is not None and when > 1e10:  # enqueue.lua's bound on a due time (1e13 ms)
        raise InvalidTask(f"at must be epoch seconds up to 1e10, got {at!r}")
    if after is None:
        after = ()
    if not isinstance(after, (str, Iterable)):
        raise InvalidTask(f"after must be task ids, got {after!r}")
    ids = (after,) if isinstance(after, str) else tuple(after)
    parents = tuple(dict.fromkeys(_name("parent id", p) for p in ids))  # once each, in order
    if len(parents) > MAX_PARENTS:
        raise InvalidTask(f"after names {len(parents)} tasks; at most {MAX_PARENTS}")
    if parents and (delay is not None or when is not None):
        raise InvalidTask("after cannot be combined with delay_s or at")
    return delay, when, parents


def deferral_args(spec: TaskSpec) -> tuple[str, str, str]:
    """enqueue.lua's fields 14..16 of a task: due ("" now, "+<ms>" after a delay, "<ms>" an
    epoch time), after (parent ids, comma-separated) and after_any ("1"/"0")."""
    due = ("" if spec.at is None else str(int(spec.at * 1000))) if spec.delay_s is None \
        else f"+{int(spec.delay_s * 1000)}"
    return due, ",".join(spec.after), "1" if spec.after_any_outcome else "0"


def build_specs(tasks: Iterable[Mapping[str, Any]]) -> list[TaskSpec]:
    """Validate every task of a bulk enqueue before anything is sent."""
    if isinstance(tasks, (str, bytes, Mapping)) or not isinstance(tasks, Iterable):
        raise InvalidTask(f"a bulk enqueue takes a list of task mappings, got {type(tasks).__name__}")
    specs = []
    for i, t in enumerate(tasks):
        try:
            specs.append(TaskSpec.build(**t))
        except (TypeError, InvalidTask) as exc:  # no handler, an unknown option, a bad value
            why = exc.reason if isinstance(exc, InvalidTask) else re.sub(  # enqueue's words
                r"\S*TaskSpec\.build\(\) (argument after \*\* )?", "", str(exc))
            raise InvalidTask(f"task {i} of the batch: {why}", getattr(exc, "task_id", None)) from None
    seen: set[str] = set()
    for spec in specs:  # one call's chunks are separate scripts: catch repeats before any
        if spec.task_id in seen:
            raise DuplicateTask(spec.task_id)
        seen.add(spec.task_id)
    return specs


def _seconds(fields: dict[str, str], name: str) -> float | None:
    """Stored timestamps are epoch milliseconds; records carry epoch seconds."""
    value = fields.get(name, "")
    return int(value) / 1000.0 if value != "" else None


@dataclass(frozen=True)
class TaskRecord:
    """A stored task as read back from Redis. Timestamps are epoch seconds."""

    id: str
    handler: str
    payload: Any
    model: str
    vram_gb: float
    priority: Priority
    est_s: float
    deadline: float | None
    preemptible: bool
    tenant: str
    max_attempts: int
    attempt: int
    state: State
    worker: str | None
    token: int | None
    enqueued_at: float
    started_at: float | None
    finished_at: float | None
    result: Any
    error: str | None
    preemptions: int = 0  # times it gave way to higher-priority work
    checkpoint: Any = None  # what its last preempted run saved for the next one
    est_from: str | None = None  # "history": est_s is the learned mean, none was given
    gpus: int = 1  # devices it runs across
    progress: float | None = None  # the last ctx.progress fraction reported (0..1), if any
    progress_msg: str | None = None  # and its message
    due_at: float | None = None  # enqueued with a delay: when it is (was) due
    parents: list[str] = field(default_factory=list)  # enqueued with `after`: its parents
    schedule: str | None = None  # a periodic run: "<schedule name> <period, epoch ms>"
    offered: str | None = None  # the worker it was last offered to (docs/PROTOCOL.md, wake rule)

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> TaskRecord:
        """The record of a stored hash; CorruptTask names the field a hash damaged or
        written by hand gets wrong, rather than a stack trace."""
        try:
            return cls._read(fields)
        except KeyError as exc:
            raise CorruptTask(fields.get("id", "?"), f"field {exc.args[0]} is missing") from None
        except (ValueError, TypeError, RecursionError) as exc:
            raise CorruptTask(fields.get("id", "?"), f"{type(exc).__name__}: {exc}") from None

    @classmethod
    def _read(cls, fields: dict[str, str]) -> TaskRecord:
        result = fields.get("result", "")
        return cls(
            id=fields["id"],
            handler=fields["handler"],
            payload=json.loads(fields.get("payload") or "null"),
            model=fields["model"],
            vram_gb=float(fields["vram_gb"]),
            priority=Priority(int(fields["priority"])),
            est_s=float(fields.get("est_s") or 0),
            deadline=_seconds(fields, "deadline"),
            preemptible=fields.get("preemptible", "1") == "1",
            tenant=fields.get("tenant", "default"),
            max_attempts=int(fields.get("max_attempts") or 1),
            attempt=int(fields.get("attempt") or 0),
            state=State(fields["state"]),
            worker=fields.get("worker") or None,
            token=int(fields["token"]) if fields.get("token") else None,
            enqueued_at=int(fields["enqueued_at"]) / 1000.0,
            started_at=_seconds(fields, "started_at"),
            finished_at=_seconds(fields, "finished_at"),
            result=json.loads(result) if result else None,
            error=fields.get("error") or None,
            preemptions=int(fields.get("preemptions") or 0),
            checkpoint=json.loads(fields["checkpoint"]) if fields.get("checkpoint") else None,
            est_from=fields.get("est_from") or None,
            gpus=int(fields.get("gpus") or 1),
            progress=float(fields["progress"]) if fields.get("progress") else None,
            progress_msg=fields.get("progress_msg") or None,
            due_at=_seconds(fields, "due_at"),
            parents=[p for p in fields.get("parents", "").split(",") if p],
            schedule=fields.get("schedule") or None,
            offered=fields.get("offered") or None,
        )

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["priority"] = self.priority.label
        out["state"] = self.state.value
        return out
