"""Producers' API: enqueue tasks, read their state, wait for results, cancel.

    with gpuq.Queue.from_url("redis://localhost:6379/0", pool="default") as q:
        t = q.enqueue("llm.generate", {"prompt": "hi"}, model="llama3-8b", vram_gb=16,
                      priority="online", est_s=0.4, deadline_s=2)
        t.result(timeout=5)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any, TypeVar

import redis

from gpuq import bulk
from gpuq.config import Config
from gpuq.connection import READ_TIMEOUT_S, connect, redis_errors, sentinels_of
from gpuq.errors import ConnectionFailed, GpuqError
from gpuq.producer import PENDING, Producer, Waiting, stored
from gpuq.scripts import Scripts
from gpuq.stream import Chunk, Follow, follow_call, parse_progress
from gpuq.task import State, TaskRecord, TaskSpec
from gpuq.tls import Tls

T = TypeVar("T")

class Queue(Producer[redis.Redis, "Task"]):
    """One pool on one Redis: the producer side. A context manager: leaving the block closes
    the client when ``from_url`` made it."""

    def __init__(self, client: redis.Redis, config: Config | None = None, *, url: str = "") -> None:
        super().__init__(client, config, url=url)
        self.scripts = Scripts(client, self.keys)

    @classmethod
    def from_url(cls, url: str, pool: str | None = None, config: Config | None = None) -> Queue:
        """A queue on the pool ``pool`` (None: ``config``'s pool, else "default") at ``url``;
        leaving its ``with`` block closes the client it makes."""
        base = config or Config()
        cfg = replace(base, redis_url=url, pool=base.pool if pool is None else pool).validate()
        queue = cls(connect(url, tls=Tls.of(cfg), pool=cfg.pool, socket_timeout=READ_TIMEOUT_S), cfg, url=url)
        queue.owns_client = True
        return queue

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.owns_client:
            self.close()

    def _submit(self, spec: TaskSpec, check_fit: bool) -> Task:
        self._usable()
        with redis_errors(self.url):
            self.scripts.run(self.calls.enqueue([spec], check_fit=check_fit))
        return Task(self, spec.task_id, exists=True)

    def enqueue_many(self, tasks: Iterable[Mapping[str, Any]], *, check_fit: bool = False) -> list[Task]:
        """Bulk enqueue: every task is validated first; then chunks of tasks per call, streamed
        on one connection (the server enqueues a chunk while the next is sent).

        Each mapping holds ``handler``, ``payload`` and TaskSpec.build's options. A task
        rejected by validation, or by the pool's state as it is (``check_fit``'s classes
        and handlers included), writes nothing at all, its refusal naming its place in the
        bulk; PartialEnqueue, naming the tasks stored, if a later call of a large bulk
        fails all the same (gpuq.bulk: the pool changed meanwhile, the server's memory).
        """
        self._usable()
        specs, calls = self._bulk(tasks, check_fit)
        with redis_errors(self.url):
            several = len(specs) > bulk.BULK_CHUNK
            flight = bulk.Preflight(specs, check_fit) if several else None
            if flight and flight.check(self._plain(flight.commands(self.keys))):
                bulk.taken(specs, self._plain(bulk.exists_each(self.keys, specs)))
            replies: list[Any] = []
            try:
                self.scripts.streamed(calls, replies)
            except (GpuqError, redis.RedisError) as exc:
                if not several:
                    raise
                raise self._partial(specs, replies, exc) from exc
        return [Task(self, s.task_id, exists=True) for s in specs]

    def _plain(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        return self.scripts.pipelined([], commands)

    def _partial(self, specs: list[TaskSpec], replies: list[Any], exc: Exception) -> Exception:
        """PartialEnqueue naming the tasks this bulk stored, by its calls' ``replies``
        (bulk.written), or ``exc`` when none was (or the server cannot say)."""
        stored = bulk.written(specs, replies)
        if stored is None:
            try:
                stored = self._plain(bulk.exists_each(self.keys, specs))
            except (GpuqError, redis.RedisError):
                return exc
        return bulk.outcome(specs, stored, exc, lambda tid: Task(self, tid, exists=True))

    def task(self, task_id: str) -> Task:
        return Task(self, task_id)

    def record(self, task_id: str) -> TaskRecord:
        return TaskRecord.from_fields(self._fields(task_id))

    def cancel(self, task_id: str) -> State:
        """Cancel a task; returns the state it was in."""
        self._usable()
        with redis_errors(self.url):
            return State(self.scripts.run(self.calls.cancel(task_id)))

    def requeue(self, task_id: str, reason: str = "requeued by operator") -> State:
        """Put a task back in its queue: a running one (its attempt given back), a retry
        waiting out its backoff (now), or one that ended failed, expired or canceled (fresh
        attempts, no deadline); returns its state now (failed: its hash was damaged).
        NotRequeueable if it is queued, waiting for its parents or succeeded."""
        self._usable()
        with redis_errors(self.url):
            return State(self.scripts.run(self.calls.requeue(task_id, None, reason)))

    def drain_worker(self, worker_id: str) -> None:
        """Tell a live worker to take no more tasks, finish its running ones and exit 0."""
        self._usable()
        with redis_errors(self.url):
            pipe = self.redis.pipeline(transaction=False)
            pipe.zscore(self.keys.workers, worker_id)
            pipe.time()
            self._check_live(worker_id, *pipe.execute())
            self.redis.lpush(self.keys.control(worker_id), "drain")

    def wait(self, task_id: str, timeout: float | None = None, *, exists: bool = False) -> TaskRecord:
        """Block until the task ends and return its record. One round trip per wake-up: a
        registration (so the task's end pushes its done list), a pop that rotates that list
        in place (so every waiter sees it) and a read of the task, pipelined. ``exists``
        skips the first read (we just enqueued it)."""
        self._usable()
        waiting = Waiting(task_id, timeout, self.redis)
        fields = None if waiting.may_skip_read(exists) else self._fields(task_id)
        while (record := waiting.ended(fields)) is None:
            fields = waiting.fields(self._wake_up(waiting))
        return record

    def result(self, task_id: str, timeout: float | None = None, *, exists: bool = False) -> Any:
        """Block until the task ends; its result, or TaskFailed naming how it ended. As
        ``wait``, reading only the fields that say so (no record to build)."""
        self._usable()
        waiting = Waiting(task_id, timeout, self.redis)
        values = None
        if not waiting.may_skip_read(exists):
            with redis_errors(self.url):
                values = self.redis.hmget(self.keys.task(task_id), Waiting.OUTCOME)
        while (result := waiting.outcome(values)) is PENDING:
            values = waiting.last(self._wake_up(waiting, Waiting.OUTCOME))
        return result

    def _wake_up(self, waiting: Waiting, fields: tuple[str, ...] = ()) -> list[Any]:
        """One round trip of a wait: register, pop, read (Waiting.pop_and_read); a lost
        connection is tried again while the wait may ride the outage out (Waiting.pause)."""
        return self._ridden(waiting, lambda: self.scripts.pipelined(
            [self.calls.wait(waiting.task_id)], waiting.pop_and_read(self.keys, fields)))

    def _ridden(self, waiting: Waiting, read: Callable[[], T]) -> T:
        """read() under redis_errors, tried again while the wait rides an outage out."""
        while True:
            if self.closed:  # no try through the closed pool: it would reconnect, and leak
                raise ConnectionFailed(self.url, "the queue was closed")
            try:
                with redis_errors(self.url):
                    got = read()
            except ConnectionFailed as exc:
                time.sleep(waiting.pause(exc, self.closed))
                continue
            waiting.answered()
            return got

    def stream(self, task_id: str, timeout: float | None = None) -> Iterator[Chunk]:
        """The chunks the task's handler emits, from the first kept (the stream keeps about
        the last ``stream_maxlen``: an earlier start shows as a ``seq`` past 0), as they come,
        until the task ends (then read its result as usual); ResultTimeout once ``timeout`` seconds pass
        (None: no limit). A chunk with ``restart`` opens a new run: drop what the earlier
        run sent (gpuq.stream). Blocks on XREAD, with an EXISTS of the task in the same round
        trip: TaskNotFound once the task was deleted under the read (a flush, an eviction)."""
        self._usable()
        follow = Follow(self.keys, task_id, timeout, self.redis)
        with redis_errors(self.url):
            follow.started(self.scripts.run(follow_call(task_id)))
        while not follow.done:
            # each try blocks for what is left (ResultTimeout once none is); after an outage
            # it reads again from the last chunk, as a wait does
            reply, stored = self._ridden(follow.waiting,
                                         lambda: self.scripts.pipelined([], follow.commands()))
            yield from follow.take(reply, stored)

    def progress(self, task_id: str) -> tuple[float, str] | None:
        """The task's last progress report, (fraction, message), or None before any."""
        self._usable()
        with redis_errors(self.url):
            values = self.redis.hmget(self.keys.task(task_id), "state", "progress", "progress_msg")
        return parse_progress(values, task_id)

    def _fields(self, task_id: str) -> dict[str, str]:
        self._usable()
        with redis_errors(self.url):
            return stored(self.redis.hgetall(self.keys.task(task_id)), task_id)

    def close(self) -> None:
        self.closed = True
        self.redis.close()
        for sentinel in sentinels_of(self.redis):
            sentinel.close()


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

    def cancel(self) -> State:
        return self.queue.cancel(self.id)

    def stream(self, timeout: float | None = None) -> Iterator[Chunk]:
        """``for chunk in task.stream(timeout=30): print(chunk.data)`` (Queue.stream)."""
        return self.queue.stream(self.id, timeout)

    def progress(self) -> tuple[float, str] | None:
        return self.queue.progress(self.id)

