"""Producers' API: enqueue tasks, read their state, wait for results, cancel.

    q = gpuq.Queue.from_url("redis://localhost:6379/0", pool="default")
    t = q.enqueue("llm.generate", {"prompt": "hi"}, model="llama3-8b", vram_gb=16,
                  priority="online", est_s=0.4, deadline_s=2)
    t.result(timeout=5)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

import redis

from gpuq.config import Config

# re-exported ("as"): the connection helpers lived here first, and callers import them from here
from gpuq.connection import CONNECT_OPTIONS as CONNECT_OPTIONS
from gpuq.connection import Tls
from gpuq.connection import connect as connect
from gpuq.connection import redis_errors as redis_errors
from gpuq.connection import url_checked as url_checked
from gpuq.errors import ResultTimeout, TaskFailed, TaskNotFound, WorkerNotFound
from gpuq.keys import Keys
from gpuq.scripts import Calls, Scripts, pairs_to_dict, raise_first_error
from gpuq.task import State, TaskRecord, TaskSpec, build_specs
from gpuq.wire import exchange

BULK_CHUNK = 200  # tasks per enqueue call in a bulk enqueue


class Queue:
    """One pool on one Redis: the producer side."""

    def __init__(self, client: redis.Redis, config: Config | None = None, *, url: str = "") -> None:
        self.config = config or Config()
        self.url = url or self.config.redis_url or "redis"
        self.redis = client
        self.keys = Keys(self.config.pool, self.config.prefix)
        self.scripts = Scripts(client, self.keys)
        self.calls = Calls(self.config)

    @classmethod
    def from_url(cls, url: str, pool: str = "default", config: Config | None = None) -> Queue:
        from dataclasses import replace

        cfg = replace(config or Config(), redis_url=url, pool=pool).validate()
        return cls(connect(url, tls=Tls.of(cfg), pool=pool), cfg, url=url)

    def enqueue(self, handler: str, payload: Any = None, *, check_fit: bool = False,
                **options: Any) -> Task:
        """Validate and enqueue one task in one round trip; see TaskSpec.build for options."""
        spec = TaskSpec.build(handler, payload, **options)
        with redis_errors(self.url):
            self.scripts.run(self.calls.enqueue([spec], check_fit=check_fit))
        return Task(self, spec.task_id, exists=True)

    def enqueue_many(self, tasks: Iterable[Mapping[str, Any]], *, check_fit: bool = False) -> list[Task]:
        """Bulk enqueue: every task is validated first; then chunks of tasks per call, streamed
        on one connection (the server enqueues a chunk while the next is sent).

        Each mapping holds ``handler``, ``payload`` and TaskSpec.build's options. A task
        rejected by validation writes nothing at all; the server rejects a chunk whole.
        """
        specs = build_specs(tasks)
        calls = (self.calls.enqueue(specs[i:i + BULK_CHUNK], check_fit=check_fit)
                 for i in range(0, len(specs), BULK_CHUNK))
        with redis_errors(self.url):
            self.scripts.streamed(calls)
        return [Task(self, s.task_id, exists=True) for s in specs]

    def task(self, task_id: str) -> Task:
        return Task(self, task_id)

    def record(self, task_id: str) -> TaskRecord:
        return TaskRecord.from_fields(self._fields(task_id))

    def cancel(self, task_id: str) -> str:
        """Cancel a task; returns the state it was in."""
        with redis_errors(self.url):
            return self.scripts.run(self.calls.cancel(task_id))

    def requeue(self, task_id: str, reason: str = "requeued by operator") -> str:
        """Put a task back in its queue: a running one (its attempt given back), a retry
        waiting out its backoff (now), or one that ended failed, expired or canceled (fresh
        attempts, no deadline). InvalidTask if it is queued or succeeded."""
        with redis_errors(self.url):
            return self.scripts.run(self.calls.requeue(task_id, None, reason))

    def drain_worker(self, worker_id: str) -> None:
        """Tell a live worker to take no more tasks, finish its running ones and exit 0."""
        with redis_errors(self.url):
            pipe = self.redis.pipeline(transaction=False)
            pipe.zscore(self.keys.workers, worker_id)
            pipe.time()
            expiry, (seconds, micros) = pipe.execute()
            # listed but past its liveness: dead, not yet reaped; nobody would read the message
            if expiry is None or expiry < int(seconds) * 1000 + int(micros) // 1000:
                raise WorkerNotFound(worker_id)
            self.redis.lpush(self.keys.control(worker_id), "drain")

    def wait(self, task_id: str, timeout: float | None = None, *, exists: bool = False) -> TaskRecord:
        """Block until the task ends and return its record. One round trip per wake-up: a
        pop that rotates the task's done list in place (so every waiter sees it) pipelined
        with a read of the task. ``exists`` skips the first read (we just enqueued it)."""
        waiting = Waiting(task_id, timeout, self.redis)
        fields = None if waiting.may_skip_read(exists) else self._fields(task_id)
        while (record := waiting.ended(fields)) is None:
            with redis_errors(self.url):
                fields = waiting.fields(exchange(self.redis, waiting.pop_and_read(self.keys),
                                                 retry=True))
        return record

    def result(self, task_id: str, timeout: float | None = None, *, exists: bool = False) -> Any:
        """Block until the task ends; its result, or TaskFailed naming how it ended. As
        ``wait``, reading only the fields that say so (no record to build)."""
        waiting = Waiting(task_id, timeout, self.redis)
        values = None
        if not waiting.may_skip_read(exists):
            with redis_errors(self.url):
                values = self.redis.hmget(self.keys.task(task_id), Waiting.OUTCOME)
        while (result := waiting.outcome(values)) is PENDING:
            with redis_errors(self.url):
                values = waiting.last(exchange(
                    self.redis, waiting.pop_and_read(self.keys, Waiting.OUTCOME), retry=True))
        return result

    def _fields(self, task_id: str) -> dict[str, str]:
        with redis_errors(self.url):
            fields = self.redis.hgetall(self.keys.task(task_id))
        if not fields:
            raise TaskNotFound(task_id)
        return {str(k): str(v) for k, v in fields.items()}

    def close(self) -> None:
        self.redis.close()


PENDING = object()  # Waiting.outcome: the task has not ended yet


class Waiting:
    """The bookkeeping of a result wait, shared by the sync and async clients."""

    MAX_BLOCK_S = 60.0  # re-read the task at least this often, whatever the timeout
    OUTCOME = ("state", "result", "error")  # what a result wait reads of the task

    def __init__(self, task_id: str, timeout: float | None, client: Any = None) -> None:
        self.task_id = task_id
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        # a client with a read timeout would fail a longer pop with a socket timeout: block a
        # little less than it. redis-py applies 5 s when the client was not given one.
        kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
        read_timeout = kwargs.get("socket_timeout", 5.0) if client is not None else None
        self.max_block_s = self.MAX_BLOCK_S if not read_timeout else max(0.1, min(
            self.MAX_BLOCK_S, float(read_timeout) - 1.0))

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
        if State(state).terminal:
            raise TaskFailed(self.task_id, state, error or "")
        return PENDING

    def pop_and_read(self, keys: Keys, fields: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
        """Block until the done list has an element, rotating it in place so every waiter
        sees it (nothing to push back), then read the task (those fields, else the whole
        hash): one round trip per wake-up."""
        done = keys.done(self.task_id)
        read = ("HMGET", keys.task(self.task_id), *fields) if fields else ("HGETALL", keys.task(self.task_id))
        return [("BLMOVE", done, done, "RIGHT", "LEFT", self.block_s()), read]

    @staticmethod
    def fields(replies: list[Any]) -> dict[str, str]:
        """The task hash read by ``pop_and_read``'s replies (a map under RESP3, a flat list
        under RESP2); a server error raised."""
        read = Waiting.last(replies)
        return read if isinstance(read, dict) else pairs_to_dict(read)

    @staticmethod
    def last(replies: list[Any]) -> Any:
        """The read's reply of ``pop_and_read``'s replies; a server error raised."""
        return raise_first_error(replies)[1]

    def block_s(self) -> float:
        """How long the next pop may block; ResultTimeout once the timeout has passed."""
        if self.deadline is None:
            return self.max_block_s
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ResultTimeout(self.task_id, self.timeout or 0.0)
        return min(left, self.max_block_s)


class Task:
    """A handle on one enqueued task."""

    def __init__(self, queue: Queue, task_id: str, *, exists: bool = False) -> None:
        self.queue = queue
        self.id = task_id
        self._exists = exists  # known to be stored: result() may skip its first read

    def __repr__(self) -> str:
        return f"Task({self.id!r})"

    def status(self) -> State:
        return self.queue.record(self.id).state

    def record(self) -> TaskRecord:
        return self.queue.record(self.id)

    def result(self, timeout: float | None = None) -> Any:
        return self.queue.result(self.id, timeout, exists=self._exists)

    def cancel(self) -> str:
        return self.queue.cancel(self.id)

