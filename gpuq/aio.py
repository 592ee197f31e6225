"""The asyncio producer API: the same surface as gpuq.client on ``redis.asyncio``.

    async with AsyncQueue.from_url("redis://localhost:6379/0") as q:
        t = await q.enqueue("llm.generate", {"prompt": "hi"}, model="llama3-8b", vram_gb=16)
        await t.result(timeout=5)

Arguments and replies of every script come from the same ``Calls`` as the sync client, and
validation and waiting from the same ``gpuq.producer``, so only the awaiting differs. A queue
belongs to the event loop of its first call: make one per loop (``AsyncQueue._usable``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import replace
from typing import Any, TypeVar

import redis.asyncio as aredis
import redis.exceptions

from gpuq import bulk
from gpuq.config import Config
from gpuq.connection import connect_async, redis_errors, sentinels_of
from gpuq.errors import ConfigError, ConnectionFailed, GpuqError
from gpuq.functions import Sender
from gpuq.keys import Keys
from gpuq.producer import PENDING, Producer, Waiting, stored
from gpuq.scripts import RELOADS, SCRIPT_NAMES, Call, Resend, wait_command
from gpuq.stream import Chunk, Follow, follow_call, parse_progress
from gpuq.task import State, TaskRecord, TaskSpec
from gpuq.tls import Tls

T = TypeVar("T")
TRY_SLACK_S = 1.0  # a result wait's try past what is left of its timeout (AsyncQueue._ridden)


async def exchange(client: aredis.Redis, commands: Iterable[tuple[Any, ...]], *,
                   retry: bool = False) -> list[Any]:
    """gpuq.wire.exchange on an asyncio client: commands sent on one pooled connection,
    then a reply read for each (a server error in its place); with ``retry``, in one write,
    sent again on a lost connection under the client's retry policy."""
    pool = client.connection_pool
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]

    async def send_and_read(sends: Iterable[tuple[Any, int]]) -> list[Any]:
        n = 0
        for chunks, count in sends:
            # a health check's PING would read an earlier command's reply as its own
            await conn.send_packed_command(chunks, check_health=n == 0)
            n += count
        replies: list[Any] = []
        for _ in range(n):
            try:
                replies.append(await conn.read_response())
            except redis.exceptions.ResponseError as exc:
                replies.append(exc)
        return replies

    try:
        if retry:
            listed = list(commands)
            packed = conn.pack_commands(listed)
            replies: list[Any] = await conn.retry.call_with_retry(
                lambda: send_and_read([(packed, len(listed))]), lambda _error: conn.disconnect())
            return replies
        return await send_and_read((conn.pack_command(*args), 1) for args in commands)
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        await pool.release(conn)


class AsyncScripts:
    """gpuq.scripts.Scripts on an asyncio client: the same calls, awaited."""

    def __init__(self, client: aredis.Redis, keys: Keys, url: str) -> None:
        self.client = client
        self.keys = keys
        self.url = url
        self.sender = Sender(SCRIPT_NAMES, keys.base)

    def command(self, call: Call[Any]) -> tuple[Any, ...]:
        """The bare FCALL (or EVALSHA) of a call."""
        return self.sender.command(call)

    async def run(self, call: Call[T]) -> T:
        with redis_errors(self.url):
            reply = (await self.pipelined([call]))[0]
        return call.parse(reply)

    async def pipelined(self, calls: Sequence[Call[Any]],
                        extra: Sequence[tuple[Any, ...]] = ()) -> list[Any]:
        """The calls, then the plain commands in ``extra``, in one round trip; replies raw,
        in order, the first error raised once all are read (gpuq.scripts.Scripts.pipelined,
        without joining acks: no asyncio caller sends several)."""
        wait = wait_command(calls)
        commands = [self.command(c) for c in calls] + list(extra) + ([wait] if wait else [])
        return await self._loaded(await exchange(self.client, commands, retry=True), calls, wait)

    async def streamed(self, calls: Iterable[Call[T]], seen: list[Any] | None = None) -> list[T]:
        """Calls built and sent one after another on one connection, replies read after the
        last and parsed; ``seen`` gets the raw replies first (gpuq.scripts.Scripts.streamed)."""
        sent: list[Call[T]] = []

        def commands() -> Iterator[tuple[Any, ...]]:
            for call in calls:
                sent.append(call)
                yield self.command(call)
            if (wait := wait_command(sent)) is not None:
                yield wait

        replies = await self._loaded(await exchange(self.client, commands()), sent,
                                     wait_command(sent), seen)
        return [c.parse(r) for c, r in zip(sent, replies)]

    async def _loaded(self, replies: list[Any], calls: Sequence[Call[Any]],
                      wait: tuple[Any, ...] | None = None, seen: list[Any] | None = None) -> list[Any]:
        """gpuq.scripts.Scripts._loaded, awaited."""
        resend = Resend(replies, calls, wait)
        for _ in range(RELOADS):
            if not resend.missing:
                break
            await self.load()
            resend.merge(await exchange(self.client, resend.commands(self.command), retry=True))
        if seen is not None:
            seen.extend(resend.replies)
        return resend.checked()


    async def load(self) -> None:
        """gpuq.scripts.Scripts.load, awaited."""
        if self.sender.fcall:
            try:
                await self.client.function_load(self.sender.library.source)
                return
            except redis.ResponseError as exc:
                if not self.sender.library_refused(exc):
                    return
        for source in self.sender.sources.values():
            await self.client.script_load(source)
        self.sender.scripts_loaded()


class AsyncQueue(Producer[aredis.Redis, Coroutine[Any, Any, "AsyncTask"]]):
    """gpuq.client.Queue on ``redis.asyncio``; ``enqueue`` validates at once and returns the
    awaitable that sends. An async context manager: leaving the block closes the client when
    ``from_url`` made it."""

    def __init__(self, client: aredis.Redis, config: Config | None = None, *, url: str = "") -> None:
        super().__init__(client, config, url=url)
        self.scripts = AsyncScripts(client, self.keys, self.url)
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop of its first call

    @classmethod
    def from_url(cls, url: str, pool: str | None = None, config: Config | None = None) -> AsyncQueue:
        """A queue on the pool ``pool`` (None: ``config``'s pool, else "default") at ``url``;
        leaving its ``with`` block closes the client it makes."""
        base = config or Config()
        cfg = replace(base, redis_url=url, pool=base.pool if pool is None else pool).validate()
        queue = cls(connect_async(url, tls=Tls.of(cfg)), cfg, url=url)
        queue.owns_client = True
        return queue

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.owns_client:
            await self.close()

    def _usable(self) -> None:
        """As Producer._usable; and ConfigError in an event loop other than the one of its
        first call: the pool's connections belong to that loop (a call from another failed
        with "Event loop is closed" or "attached to a different loop", or took a
        connection of the other loop, left open)."""
        super()._usable()
        loop = asyncio.get_running_loop()
        if self.loop is None:
            self.loop = loop
        elif loop is not self.loop:
            raise ConfigError("an AsyncQueue belongs to the event loop of its first call: make one "
                              "per event loop (AsyncQueue.from_url in that loop)")

    async def _submit(self, spec: TaskSpec, check_fit: bool) -> AsyncTask:
        self._usable()
        await self.scripts.run(self.calls.enqueue([spec], check_fit=check_fit))
        return AsyncTask(self, spec.task_id, exists=True)

    async def enqueue_many(self, tasks: Iterable[Mapping[str, Any]], *,
                           check_fit: bool = False) -> list[AsyncTask]:
        """Bulk enqueue (see gpuq.client.Queue.enqueue_many). Cancelled (asyncio.wait_for) while
        a bulk of several calls is in flight, the calls sent by then stay stored: read back
        the tasks' ids to know which."""
        self._usable()
        specs, calls = self._bulk(tasks, check_fit)
        with redis_errors(self.url):
            several = len(specs) > bulk.BULK_CHUNK
            flight = bulk.Preflight(specs, check_fit) if several else None
            if flight and flight.check(await self._plain(flight.commands(self.keys))):
                bulk.taken(specs, await self._plain(bulk.exists_each(self.keys, specs)))
            replies: list[Any] = []
            try:
                await self.scripts.streamed(calls, replies)
            except (GpuqError, redis.exceptions.RedisError) as exc:
                if not several:
                    raise
                raise await self._partial(specs, replies, exc) from exc
        return [AsyncTask(self, s.task_id, exists=True) for s in specs]

    async def _plain(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        return await self.scripts.pipelined([], commands)

    async def _partial(self, specs: list[TaskSpec], replies: list[Any], exc: Exception) -> Exception:
        """PartialEnqueue naming the tasks stored, or ``exc`` (gpuq.client.Queue._partial)."""
        stored = bulk.written(specs, replies)
        if stored is None:
            try:
                stored = await self._plain(bulk.exists_each(self.keys, specs))
            except (GpuqError, redis.exceptions.RedisError):
                return exc
        return bulk.outcome(specs, stored, exc, lambda tid: AsyncTask(self, tid, exists=True))

    def task(self, task_id: str) -> AsyncTask:
        return AsyncTask(self, task_id)

    async def record(self, task_id: str) -> TaskRecord:
        return TaskRecord.from_fields(await self._fields(task_id))

    async def cancel(self, task_id: str) -> State:
        """Cancel a task; returns the state it was in."""
        self._usable()
        previous = await self.scripts.run(self.calls.cancel(task_id))
        return State(previous)

    async def requeue(self, task_id: str, reason: str = "requeued by operator") -> State:
        """Put a task back in its queue (see gpuq.client.Queue.requeue)."""
        self._usable()
        state = await self.scripts.run(self.calls.requeue(task_id, None, reason))
        return State(state)

    async def drain_worker(self, worker_id: str) -> None:
        """Tell a live worker to take no more tasks, finish its running ones and exit 0."""
        self._usable()
        with redis_errors(self.url):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zscore(self.keys.workers, worker_id)
                pipe.time()
                self._check_live(worker_id, *await pipe.execute())
            await self.redis.lpush(self.keys.control(worker_id), "drain")

    async def wait(self, task_id: str, timeout: float | None = None, *,
                   exists: bool = False) -> TaskRecord:
        """Block until the task ends (see gpuq.client.Queue.wait); return its record."""
        self._usable()
        waiting = Waiting(task_id, timeout, self.redis)
        fields = None if waiting.may_skip_read(exists) else await self._fields(task_id)
        while (record := waiting.ended(fields)) is None:
            fields = waiting.fields(await self._wake_up(waiting))
        return record

    async def result(self, task_id: str, timeout: float | None = None, *,
                     exists: bool = False) -> Any:
        """The task's result once it ends (see gpuq.client.Queue.result)."""
        self._usable()
        waiting = Waiting(task_id, timeout, self.redis)
        values = None
        if not waiting.may_skip_read(exists):
            with redis_errors(self.url):
                values = await self.redis.hmget(self.keys.task(task_id), Waiting.OUTCOME)
        while (result := waiting.outcome(values)) is PENDING:
            values = waiting.last(await self._wake_up(waiting, Waiting.OUTCOME))
        return result

    async def _wake_up(self, waiting: Waiting, fields: tuple[str, ...] = ()) -> list[Any]:
        """One round trip of a wait: register, pop, read; an outage ridden out (see
        gpuq.client.Queue._wake_up)."""
        return await self._ridden(waiting, lambda: self.scripts.pipelined(
            [self.calls.wait(waiting.task_id)], waiting.pop_and_read(self.keys, fields)))

    async def _ridden(self, waiting: Waiting, read: Callable[[], Awaitable[T]]) -> T:
        """gpuq.client.Queue._ridden, awaited. This client has no read timeout (see
        gpuq.connection): with a timeout, each try is bounded by what is left of it (its pop
        blocks no longer) plus TRY_SLACK_S, so a server that stops answering (frozen, a
        partition) fails the wait near its timeout, not when the server comes back."""
        while True:
            if self.closed:  # no try through the closed pool: it would reconnect, and leak
                raise ConnectionFailed(self.url, "the queue was closed")
            try:
                with redis_errors(self.url):
                    if waiting.deadline is None:
                        got = await read()
                    else:
                        try:  # a cancelled exchange drops its connection (exchange)
                            async with asyncio.timeout(waiting.deadline - time.monotonic() + TRY_SLACK_S):
                                got = await read()
                        except TimeoutError:
                            raise ConnectionFailed(self.url, "no reply within the wait's timeout") from None
            except ConnectionFailed as exc:
                await asyncio.sleep(waiting.pause(exc, self.closed))
                continue
            waiting.answered()
            return got

    async def stream(self, task_id: str, timeout: float | None = None) -> AsyncIterator[Chunk]:
        """The task's chunks as they come, until it ends (see gpuq.client.Queue.stream)."""
        self._usable()
        follow = Follow(self.keys, task_id, timeout, self.redis)
        follow.started(await self.scripts.run(follow_call(task_id)))
        while not follow.done:
            # each try blocks for what is left (ResultTimeout once none is); after an outage
            # it reads again from the last chunk, as a wait does
            reply, stored = await self._ridden(
                follow.waiting, lambda: self.scripts.pipelined([], follow.commands()))
            for chunk in follow.take(reply, stored):
                yield chunk

    async def progress(self, task_id: str) -> tuple[float, str] | None:
        """The task's last progress report, (fraction, message), or None before any."""
        self._usable()
        with redis_errors(self.url):
            values = await self.redis.hmget(self.keys.task(task_id), "state", "progress",
                                            "progress_msg")
        return parse_progress(values, task_id)

    async def _fields(self, task_id: str) -> dict[str, str]:
        self._usable()
        with redis_errors(self.url):
            return stored(await self.redis.hgetall(self.keys.task(task_id)), task_id)

    async def close(self) -> None:
        self.closed = True
        await self.redis.aclose()
        for sentinel in sentinels_of(self.redis):
            await sentinel.aclose()


class AsyncTask:
    def __init__(self, queue: AsyncQueue, task_id: str, *, exists: bool = False) -> None:
        self.queue = queue
        self.id = task_id
        self._exists = exists

    def __repr__(self) -> str:
        return f"AsyncTask({self.id!r})"

    async def status(self) -> State:
        return (await self.queue.record(self.id)).state

    async def record(self) -> TaskRecord:
        return await self.queue.record(self.id)

    async def result(self, timeout: float | None = None) -> Any:
        return await self.queue.result(self.id, timeout, exists=self._exists)

    async def cancel(self) -> State:
        return await self.queue.cancel(self.id)

    def stream(self, timeout: float | None = None) -> AsyncIterator[Chunk]:
        """``async for chunk in task.stream(timeout=30): ...`` (AsyncQueue.stream)."""
        return self.queue.stream(self.id, timeout)

    async def progress(self) -> tuple[float, str] | None:
        return await self.queue.progress(self.id)


__all__ = ["AsyncQueue", "AsyncTask"]
