"""The asyncio producer API: the same surface as gpuq.client on ``redis.asyncio``.

Arguments and replies of every script come from the same ``Calls`` as the sync client,
so only the awaiting differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import redis.asyncio as aredis
import redis.exceptions

from gpuq.client import BULK_CHUNK, PENDING, Waiting, redis_errors
from gpuq.config import Config
from gpuq.connection import Tls, connect_async
from gpuq.errors import TaskNotFound
from gpuq.keys import Keys
from gpuq.scripts import (
    SCRIPT_NAMES,
    Call,
    Calls,
    check_replicas,
    evalsha_args,
    noscript_indexes,
    raise_first_error,
    script_source,
    wait_command,
)
from gpuq.task import State, TaskRecord, TaskSpec, build_specs

T = TypeVar("T")


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


class AsyncQueue:
    def __init__(self, client: aredis.Redis, config: Config | None = None, *, url: str = "") -> None:
        self.config = config or Config()
        self.url = url or self.config.redis_url or "redis"
        self.redis = client
        self.keys = Keys(self.config.pool, self.config.prefix)
        self.calls = Calls(self.config)
        self._scripts = {n: client.register_script(script_source(n)) for n in SCRIPT_NAMES}

    @classmethod
    def from_url(cls, url: str, pool: str = "default", config: Config | None = None) -> AsyncQueue:
        cfg = replace(config or Config(), redis_url=url, pool=pool).validate()
        return cls(connect_async(url, tls=Tls.of(cfg)), cfg, url=url)

    async def run(self, call: Call[T]) -> T:
        with redis_errors(self.url):
            wait = wait_command([call])
            commands = [evalsha_args(self._scripts, self.keys, call)] + ([wait] if wait else [])
            replies = await exchange(self.redis, commands, retry=True)
            reply = (await self._loaded(replies, [call], wait))[0]
        return call.parse(reply)

    async def enqueue(self, handler: str, payload: Any = None, *, check_fit: bool = False,
                      **options: Any) -> AsyncTask:
        spec = TaskSpec.build(handler, payload, **options)
        await self.run(self.calls.enqueue([spec], check_fit=check_fit))
        return AsyncTask(self, spec.task_id, exists=True)

    async def enqueue_many(self, tasks: Iterable[Mapping[str, Any]], *,
                           check_fit: bool = False) -> list[AsyncTask]:
        specs = build_specs(tasks)
        calls = (self.calls.enqueue(specs[i:i + BULK_CHUNK], check_fit=check_fit)
                 for i in range(0, len(specs), BULK_CHUNK))
        with redis_errors(self.url):
            await self.streamed(calls)
        return [AsyncTask(self, s.task_id, exists=True) for s in specs]

    async def streamed(self, calls: Iterable[Call[T]]) -> list[T]:
        """Calls built and sent one after another on one connection, replies read after the
        last and parsed (gpuq.scripts.Scripts.streamed)."""
        sent: list[Call[T]] = []

        def commands() -> Iterator[tuple[Any, ...]]:
            for call in calls:
                sent.append(call)
                yield evalsha_args(self._scripts, self.keys, call)
            if (wait := wait_command(sent)) is not None:
                yield wait

        replies = await self._loaded(await exchange(self.redis, commands()), sent, wait_command(sent))
        return [c.parse(r) for c, r in zip(sent, replies)]

    async def _loaded(self, replies: list[Any], calls: Sequence[Call[Any]],
                      wait: tuple[Any, ...] | None = None) -> list[Any]:
        """gpuq.scripts.Scripts._loaded, awaited: calls whose script was missing sent again
        once the scripts are loaded (and the WAIT after them); the first error raised, then
        WAIT's count checked."""
        acked = replies.pop() if wait is not None else None
        if missing := noscript_indexes(replies):
            for script in self._scripts.values():
                await self.redis.script_load(script.script)
            resend = [evalsha_args(self._scripts, self.keys, calls[i]) for i in missing]
            again = await exchange(self.redis, resend + ([wait] if wait else []), retry=True)
            if wait is not None:
                acked = again.pop()
            for i, reply in zip(missing, again):
                replies[i] = reply
        raise_first_error(replies)
        if wait is not None:
            check_replicas(calls, replies, acked)
        return replies

    async def record(self, task_id: str) -> TaskRecord:
        return TaskRecord.from_fields(await self._fields(task_id))

    async def cancel(self, task_id: str) -> str:
        return await self.run(self.calls.cancel(task_id))

    async def wait(self, task_id: str, timeout: float | None = None, *,
                   exists: bool = False) -> TaskRecord:
        """Block until the task ends (see gpuq.client.Queue.wait); return its record."""
        waiting = Waiting(task_id, timeout, self.redis)
        fields = None if waiting.may_skip_read(exists) else await self._fields(task_id)
        while (record := waiting.ended(fields)) is None:
            with redis_errors(self.url):
                fields = waiting.fields(await exchange(self.redis, waiting.pop_and_read(self.keys),
                                                       retry=True))
        return record

    async def result(self, task_id: str, timeout: float | None = None, *,
                     exists: bool = False) -> Any:
        """The task's result once it ends (see gpuq.client.Queue.result)."""
        waiting = Waiting(task_id, timeout, self.redis)
        values = None
        if not waiting.may_skip_read(exists):
            with redis_errors(self.url):
                values = await self.redis.hmget(self.keys.task(task_id), Waiting.OUTCOME)
        while (result := waiting.outcome(values)) is PENDING:
            with redis_errors(self.url):
                values = waiting.last(await exchange(
                    self.redis, waiting.pop_and_read(self.keys, Waiting.OUTCOME), retry=True))
        return result

    async def _fields(self, task_id: str) -> dict[str, str]:
        with redis_errors(self.url):
            fields = await self.redis.hgetall(self.keys.task(task_id))
        if not fields:
            raise TaskNotFound(task_id)
        return {str(k): str(v) for k, v in fields.items()}

    async def close(self) -> None:
        await self.redis.aclose()


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

    async def cancel(self) -> str:
        return await self.queue.cancel(self.id)


__all__ = ["AsyncQueue", "AsyncTask"]
