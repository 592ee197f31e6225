"""What the sync and the asyncio producer share: the enqueue signature and its validation,
bulk chunking, the liveness check of a drain, and the bookkeeping of a result wait.

``gpuq.client.Queue`` and ``gpuq.aio.AsyncQueue`` derive from ``Producer`` and add only the
sending, blocking or awaited; neither imports the other.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from gpuq.bulk import BULK_CHUNK
from gpuq.clock import from_time_reply
from gpuq.config import Config
from gpuq.errors import (
    ConfigError,
    ConnectionFailed,
    CorruptTask,
    NoMaster,
    ResultTimeout,
    TaskFailed,
    TaskNotFound,
    WorkerNotFound,
)
from gpuq.keys import Keys
from gpuq.replies import hash_reply, raise_for
from gpuq.scripts import Call, Calls, raise_first_error
from gpuq.task import Priority, State, TaskRecord, TaskSpec, _flag, build_specs

PENDING = object()  # Waiting.outcome: the task has not ended yet

ClientT = TypeVar("ClientT")
EnqueuedT = TypeVar("EnqueuedT")  # what enqueue returns: a handle, or an awaitable of one


class Producer(Generic[ClientT, EnqueuedT]):
    """One pool on one Redis, the producer side, whatever the client."""

    def __init__(self, client: ClientT, config: Config | None = None, *, url: str = "") -> None:
        self.config = (config or Config()).validate()  # a bad pool name must write no key
        self.url = url or self.config.redis_url or "redis"
        encoder = getattr(client, "get_encoder", None)
        if encoder is not None and not encoder().decode_responses:  # every reader takes text
            raise ConfigError("the Redis client must decode replies: make it with "
                              "decode_responses=True, or use gpuq.connection.connect(url) "
                              "(connect_async for the asyncio client)")
        self.redis = client
        self.keys = Keys(self.config.pool, self.config.prefix)
        self.calls = Calls(self.config)
        self.owns_client = False  # from_url made the client: leaving a ``with`` block closes it
        self.closed = False  # close() was called: a wait it breaks is not an outage

    def enqueue(self, handler: str, payload: Any = None, *, model: str, vram_gb: float,
                priority: Priority | int | str = Priority.P2, est_s: float | None = None,
                deadline_s: float | None = None, preemptible: bool = True, tenant: str = "default",
                max_attempts: int = 3, task_id: str | None = None, check_fit: bool = False,
                gpus: int = 1, delay_s: float | None = None, at: float | None = None,
                after: Iterable[str] = (), after_any_outcome: bool = False) -> EnqueuedT:
        """Validate and enqueue one task in one round trip (the asyncio client: awaited).

        ``payload``: JSON-serializable data. ``model`` and ``vram_gb`` (weights included)
        place it; ``priority``: P0..P3, 0..3 or online/nearline/batch/offline; ``est_s``:
        estimated run seconds (None: the mean the pool learned from this handler and model's
        successful runs, else 1); ``deadline_s``: seconds from now by which it should end: a
        queued task that can no longer (now + ``est_s``, plus a load while no live worker
        holds its model) expires; a run under way is not cut short (``timeout_s`` on its
        handler bounds that); ``preemptible=False``: never interrupted for higher-priority work;
        ``max_attempts``: 1..100; ``task_id``: default a new unique id; ``gpus``: devices it
        runs across (1..64; only a worker with a group of at least that many claims it, and
        ``vram_gb`` is its need over all of them). ``check_fit``: Unschedulable if no
        registered GPU class fits it or no worker registers its handler.
        ``delay_s`` (seconds) or ``at`` (epoch seconds, not past by the server's clock): it
        waits, state delayed, and is queued when due (its SLA and deadline count from then).
        ``after``: ids of tasks it waits for, state waiting: queued once every one succeeded
        (with ``after_any_outcome``: once every one ended), canceled if one ends otherwise.
        InvalidTask, before anything is sent, for bad input.
        """
        check_fit = _flag("check_fit", check_fit)  # "no" would read as true
        spec = TaskSpec.build(handler, payload, model=model, vram_gb=vram_gb, priority=priority,
                              est_s=est_s, deadline_s=deadline_s, preemptible=preemptible,
                              tenant=tenant, max_attempts=max_attempts, task_id=task_id,
                              gpus=gpus, delay_s=delay_s, at=at, after=after,
                              after_any_outcome=after_any_outcome)
        return self._submit(spec, check_fit)

    def _submit(self, spec: TaskSpec, check_fit: bool) -> EnqueuedT:
        raise NotImplementedError

    def _usable(self) -> None:
        """ConnectionFailed once close() was called: a call through the closed pool would
        reconnect, and hold connections nothing closes."""
        if self.closed:
            raise ConnectionFailed(self.url, "the queue was closed")

    def _bulk(self, tasks: Iterable[Mapping[str, Any]],
              check_fit: bool) -> tuple[list[TaskSpec], Iterator[Call[int]]]:
        """Every task validated first (nothing sent if one is bad), then its enqueue calls,
        BULK_CHUNK tasks each, built as they are sent; more than one call: the pool's state
        checked first (gpuq.bulk)."""
        check_fit = _flag("check_fit", check_fit)
        specs = build_specs(tasks)
        return specs, (self.calls.enqueue(specs[i:i + BULK_CHUNK], check_fit=check_fit, first=i)
                       for i in range(0, len(specs), BULK_CHUNK))

    @staticmethod
    def _check_live(worker_id: str, expiry: float | None, server_time: tuple[int, int]) -> None:
        """WorkerNotFound unless the worker's liveness score (ZSCORE of the workers set) is
        past the server's TIME: a drain message to it would never be read."""
        # listed but past its liveness: dead, not yet reaped
        if expiry is None or expiry < from_time_reply(server_time):
            raise WorkerNotFound(worker_id)


class Waiting:
    """The bookkeeping of a result wait, shared by the sync and async clients."""

    # re-read the task at least this often, whatever the timeout: a task deleted under the wait
    # (a flush, an eviction, a result TTL of 0) pushes no done list, and only a read finds it gone
    MAX_BLOCK_S = 5.0
    # a wait rides out a Redis outage (a restart, a failover) this long, within its timeout
    OUTAGE_S = 30.0
    OUTCOME = ("state", "result", "error")  # what a result wait reads of the task

    def __init__(self, task_id: str, timeout: float | None, client: Any = None) -> None:
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not timeout >= 0):  # nan fails the comparison
            raise ConfigError(f"timeout must be seconds >= 0 (or None: no limit), got {timeout!r}")
        self.task_id = task_id
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        # a client with a read timeout would fail a longer pop with a socket timeout: block a
        # little less than it. redis-py applies 5 s when the client was not given one.
        kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
        read_timeout = kwargs.get("socket_timeout", 5.0) if client is not None else None
        self.max_block_s = self.MAX_BLOCK_S if not read_timeout else max(0.1, min(
            self.MAX_BLOCK_S, float(read_timeout) - 1.0))
        self.down_since: float | None = None  # when Redis stopped answering this wait
        self.backoff = 0.0

    def pause(self, error: ConnectionFailed, closed: bool = False) -> float:
        """The seconds to wait before trying Redis again after ``error``: 0.1 doubling to 2,
        while the outage is within OUTAGE_S and the pause ends before the timeout; else
        ``error`` is raised. Only a lost connection (or no master yet) is waited out: a
        refusal or failed credentials would be the same on the next try, and a connection
        the queue's close() broke (closed) is no outage."""
        now = time.monotonic()
        if closed:  # the error the break gave names the server: the queue's own close did it
            raise ConnectionFailed(error.url, "the queue was closed") from None
        if type(error) not in (ConnectionFailed, NoMaster):
            raise error
        if self.down_since is None:
            self.down_since, self.backoff = now, 0.1
        else:
            self.backoff = min(2.0, self.backoff * 2)
        if (now - self.down_since + self.backoff > self.OUTAGE_S
                or self.deadline is not None and now + self.backoff > self.deadline):
            raise error
        return self.backoff

    def answered(self) -> None:
        """Redis answered: a later outage is waited out afresh."""
        self.down_since = None

    def may_skip_read(self, exists: bool) -> bool:
        """A task known to exist is first read after the first pop, unless no pop is left."""
        return exists and (self.timeout is None or self.timeout > 0)

    def ended(self, fields: dict[str, str] | None) -> TaskRecord | None:
        """The record if the task has ended; None to keep waiting (None fields: not read)."""
        if fields is None:
            return None
        if not fields:
            raise TaskNotFound(self.task_id)
        record = TaskRecord.from_fields(fields)
        return record if record.state.terminal else None

    def outcome(self, values: list[Any] | None) -> Any:
        """The result once the task has ended (TaskFailed if it did not succeed), from its
        OUTCOME fields; PENDING to keep waiting (None: not read yet)."""
        if values is None:
            return PENDING
        state, result, error = values
        if not state:
            raise TaskNotFound(self.task_id)
        if state == State.SUCCEEDED.value:
            return json.loads(result) if result else None
        try:
            ended = State(state).terminal
        except ValueError:  # a hash damaged or written by hand
            raise CorruptTask(self.task_id, f"field state is {state!r}") from None
        if ended:
            raise TaskFailed(self.task_id, state, error or "")
        return PENDING

    def pop_and_read(self, keys: Keys, fields: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
        """What follows the registration (``Calls.wait``, which makes the task's end push
        its done list, or pushes it for a task already ended) in the same round trip: block
        until the done list has an element, rotating it in place so every waiter sees it
        (nothing to push back), then read the task (those fields, else the whole hash)."""
        done = keys.done(self.task_id)
        read = ("HMGET", keys.task(self.task_id), *fields) if fields else ("HGETALL", keys.task(self.task_id))
        return [("BLMOVE", done, done, "RIGHT", "LEFT", self.block_s()), read]

    def fields(self, replies: list[Any]) -> dict[str, str]:
        """The task hash read by a wake-up's replies (a map under RESP3, a flat list under
        RESP2); a server error raised."""
        return hash_reply(self.last(replies))

    def last(self, replies: list[Any]) -> Any:
        """The read's reply of a wake-up's replies (the registration's, the pop's, the
        read's); a server error raised, TaskNotFound when the registration found no task."""
        raise_for(raise_first_error(replies)[0], self.task_id)
        return replies[-1]

    def block_s(self) -> float:
        """How long the next pop may block; ResultTimeout once the timeout has passed."""
        if self.deadline is None:
            return self.max_block_s
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ResultTimeout(self.task_id, self.timeout or 0.0)
        return min(left, self.max_block_s)


def stored(fields: Mapping[Any, Any], task_id: str) -> dict[str, str]:
    """A task hash as read (HGETALL); TaskNotFound when there is none."""
    if not fields:
        raise TaskNotFound(task_id)
    return {str(k): str(v) for k, v in fields.items()}
