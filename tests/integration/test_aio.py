"""gpuq.aio.AsyncQueue: the same surface as the sync client, on redis.asyncio."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gpuq import Config, Queue, State
from gpuq.aio import AsyncQueue
from gpuq.embedded import EmbeddedServer
from gpuq.errors import (
    ConfigError,
    ConnectionFailed,
    InvalidTask,
    NotRequeueable,
    ResultTimeout,
    TaskFailed,
    TaskNotFound,
    WorkerNotFound,
)
from gpuq.scripts import ClaimRequest


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def make(server: EmbeddedServer, pool: str, prefix: str) -> AsyncQueue:
    return AsyncQueue.from_url(server.url, pool=pool, config=Config(prefix=prefix))


def test_enqueue_result_and_status(redis_server: EmbeddedServer, pool: str, prefix: str) -> None:
    async def scenario() -> None:
        q = make(redis_server, pool, prefix)
        try:
            t = await q.enqueue("h", {"x": 1}, model="m", vram_gb=2, priority="online")
            assert await t.status() is State.QUEUED

            async def worker() -> None:
                await asyncio.sleep(0.1)
                claim = await q.scripts.run(q.calls.claim(ClaimRequest("w", 10, 0, 1)))
                assert claim.task is not None and claim.task["id"] == t.id
                await q.scripts.run(q.calls.ack(t.id, int(claim.task["token"]), '{"y":2}'))

            acker = asyncio.ensure_future(worker())
            assert await t.result(timeout=5) == {"y": 2}
            await acker
            assert (await q.record(t.id)).state is State.SUCCEEDED
        finally:
            await q.close()

    run(scenario())


def test_bulk_cancel_timeout_and_errors(redis_server: EmbeddedServer, pool: str, prefix: str) -> None:
    async def scenario() -> None:
        q = make(redis_server, pool, prefix)
        try:
            await q.redis.script_flush()  # the stream reloads its script and sends again
            tasks = await q.enqueue_many([{"handler": "h", "model": "m", "vram_gb": 1}] * 450)
            assert len(tasks) == 450 and await tasks[-1].status() is State.QUEUED
            with pytest.raises(ResultTimeout):
                await tasks[0].result(timeout=0.2)
            assert await tasks[1].cancel() == "queued"
            with pytest.raises(TaskFailed, match="canceled"):
                await tasks[1].result(timeout=1)
            with pytest.raises(InvalidTask):
                await q.enqueue("h", model="m", vram_gb=-1)
            await q.redis.script_flush()  # a single call reloads the scripts and runs again
            assert await (await q.enqueue("h", model="m", vram_gb=1)).status() is State.QUEUED
            with pytest.raises(TaskNotFound):
                await q.record("nope")
            with pytest.raises(TaskNotFound):
                await q.result("nope", timeout=1)
        finally:
            await q.close()

    run(scenario())


def test_a_call_whose_connection_breaks_mid_send_follows_the_retry_policy(
        redis_server: EmbeddedServer, pool: str, prefix: str) -> None:
    """As the sync client: with a retry policy set, a write that fails is sent again on a
    fresh connection (a client made from a URL has no retries)."""
    async def scenario() -> None:
        q = make(redis_server, pool, prefix)
        try:
            q.redis.set_retry(Retry(NoBackoff(), 1))
            await q.enqueue("h", model="m", vram_gb=1)  # the pool now holds one connection
            conn = await q.redis.connection_pool.get_connection()
            await q.redis.connection_pool.release(conn)
            real_send = conn.send_packed_command
            broken: list[int] = []

            async def send_once_broken(*args: Any, **kwargs: Any) -> Any:
                if not broken:  # the write fails: nothing reached the server
                    broken.append(1)
                    raise redis.ConnectionError("connection reset by peer")
                return await real_send(*args, **kwargs)

            conn.send_packed_command = send_once_broken  # type: ignore[method-assign]
            t = await q.enqueue("h", model="m", vram_gb=1)
            assert broken and await t.status() is State.QUEUED
        finally:
            await q.close()

    run(scenario())


@pytest.mark.parametrize("loop_ran", [True, False], ids=["loop-ran", "loop-did-not-run"])
def test_every_call_works_after_the_server_dropped_the_connections(
        redis_server: EmbeddedServer, pool: str, prefix: str, loop_ran: bool) -> None:
    """Regression: with redis-py's maintenance notifications on (its default), the asyncio
    pool handed out connections the server had closed (a restart, a server timeout, CLIENT
    KILL): the first call on each failed with ConnectionFailed, where the sync client's
    succeeded. And regression: it still did when the event loop had not run since the close
    (the end of the stream unread in the kernel: gpuq.aio_pool)."""
    admin = redis.Redis.from_url(redis_server.url)

    async def scenario() -> None:
        q = make(redis_server, pool, prefix)
        try:
            t = await q.enqueue("h", None, model="m", vram_gb=2)
            calls = (lambda: q.enqueue("h", None, model="m", vram_gb=2), lambda: q.record(t.id),
                     lambda: t.status(), lambda: q.cancel(t.id))
            for call in calls:
                await q.record(t.id)  # the pooled connection was just used: it is open
                admin.client_kill_filter(_type="normal", skipme=True)
                if loop_ran:
                    await asyncio.sleep(0.1)  # the loop runs and reads the end of the stream
                await call()
        finally:
            await q.close()

    try:
        run(scenario())
    finally:
        admin.close()


def test_malformed_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="malformed"):
        AsyncQueue.from_url("redis://h:abc/0")


def test_task_requeue_and_drain(redis_server: EmbeddedServer, pool: str, prefix: str) -> None:
    async def scenario() -> None:
        async with make(redis_server, pool, prefix) as q:
            t = await q.enqueue("h", model="m", vram_gb=1)
            assert await q.task(t.id).cancel() is State.QUEUED
            assert await q.requeue(t.id) is State.QUEUED
            with pytest.raises(NotRequeueable):
                await q.requeue(t.id)
            with pytest.raises(WorkerNotFound):
                await q.drain_worker("w1")
            seconds, _ = await q.redis.time()
            await q.redis.zadd(q.keys.workers, {"w1": (seconds + 30) * 1000})
            await q.drain_worker("w1")
            assert await q.redis.lrange(q.keys.control("w1"), 0, -1) == ["drain"]

    run(scenario())


def test_a_callers_timeout_around_a_call_is_never_lost(redis_server: EmbeddedServer, pool: str,
                                                       prefix: str) -> None:
    """Regression: the handshake of a new connection ran with a socket timeout, so redis-py
    sent under asyncio.wait_for, which in Python 3.11 drops a cancellation landing as the send
    completes: wait_for(t.result(timeout=5), 0.0003) ran the full 5 s about one time in six
    (every cancelled call drops its connection, so the next one connects anew)."""
    async def scenario() -> None:
        async with make(redis_server, pool, prefix) as q:
            t = await q.enqueue("h", None, model="m", vram_gb=1)
            for i in range(120):
                started = time.monotonic()
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(t.result(timeout=5), [0, 0.0001, 0.0003, 0.0005, 0.001][i % 5])
                assert time.monotonic() - started < 2.5, f"attempt {i}: the cancellation was lost"

    run(scenario())


def test_close_ends_the_waits_it_breaks_and_leaves_no_connection(redis_server: EmbeddedServer, pool: str,
                                                                  prefix: str) -> None:
    """A wait that close() breaks is not an outage to ride out: it raises at once, and no
    connection is opened again."""
    admin = redis.Redis.from_url(redis_server.url, decode_responses=True)
    admin.client_setname("test-admin")

    async def scenario() -> None:
        q = make(redis_server, pool, prefix)
        tasks = [await q.enqueue("h", None, model="m", vram_gb=1) for _ in range(5)]
        waits = [asyncio.ensure_future(t.result(timeout=20)) for t in tasks]
        await asyncio.sleep(0.3)  # each blocked on its pop
        started = time.monotonic()
        await q.close()
        ended = await asyncio.gather(*waits, return_exceptions=True)
        # the queue's own close broke them, not the server (it said "Connection closed by server")
        assert all(isinstance(e, ConnectionFailed) and "the queue was closed" in str(e) for e in ended), ended
        assert time.monotonic() - started < 5
        await asyncio.sleep(0.3)
        assert [c for c in admin.client_list() if c["name"] != "test-admin"] == []

    try:
        run(scenario())
    finally:
        admin.close()


def test_more_calls_at_once_than_redis_pys_default_pool_holds(redis_server: EmbeddedServer, pool: str,
                                                              prefix: str) -> None:
    """Regression: redis-py's asyncio pool stops at 100 connections and failed the 101st call
    at once ("Too many connections"); the sync pool has no such bound, nor has gpuq's."""
    async def scenario() -> None:
        async with make(redis_server, pool, prefix) as q:
            tasks = await asyncio.gather(*[q.enqueue("h", None, model="m", vram_gb=1) for _ in range(150)])
            ended = await asyncio.gather(*[t.result(timeout=0.5) for t in tasks], return_exceptions=True)
            assert all(isinstance(e, ResultTimeout) for e in ended), {type(e) for e in ended}

    run(scenario())


def test_calls_after_close_are_refused_and_open_nothing(redis_server: EmbeddedServer, pool: str,
                                                        prefix: str) -> None:
    """Regression: enqueue, status, cancel and the other calls that are not waits went on
    after close() (sync and asyncio), reconnecting through the closed pool."""
    admin = redis.Redis.from_url(redis_server.url, decode_responses=True)
    bulk = [{"handler": "h", "model": "m", "vram_gb": 1}]
    sync = Queue.from_url(redis_server.url, pool, Config(prefix=prefix))
    t = sync.enqueue("h", model="m", vram_gb=1)
    sync.close()
    clients = len(admin.client_list())
    for call in (lambda: sync.enqueue("h", model="m", vram_gb=1), lambda: sync.enqueue_many(bulk),
                 t.status, t.record, t.cancel, t.progress, lambda: sync.requeue(t.id),
                 lambda: sync.drain_worker("w1"), lambda: sync.task(t.id).result(timeout=1),
                 lambda: sync.wait(t.id, 1), lambda: list(sync.task(t.id).stream(timeout=1))):
        with pytest.raises(ConnectionFailed, match="the queue was closed"):
            call()
    assert len(admin.client_list()) == clients

    async def scenario() -> None:
        q = make(redis_server, pool, prefix)
        a = await q.enqueue("h", model="m", vram_gb=1)
        await q.close()
        before = len(admin.client_list())
        for call in (lambda: q.enqueue("h", model="m", vram_gb=1), lambda: q.enqueue_many(bulk),
                     a.status, a.record, a.cancel, a.progress, lambda: q.requeue(a.id),
                     lambda: q.drain_worker("w1"), lambda: q.task(a.id).result(timeout=1),
                     lambda: q.wait(a.id, 1)):
            with pytest.raises(ConnectionFailed, match="the queue was closed"):
                await call()
        with pytest.raises(ConnectionFailed, match="the queue was closed"):
            [c async for c in q.task(a.id).stream(timeout=1)]
        assert len(admin.client_list()) == before

    try:
        run(scenario())
    finally:
        admin.close()


def test_a_queue_called_from_another_event_loop_is_refused(redis_server: EmbeddedServer, pool: str,
                                                           prefix: str) -> None:
    """Regression: a second loop's call took a connection of the first loop's, failing with
    a bare RuntimeError ("Event loop is closed", "attached to a different loop"), or not,
    leaving sockets open."""
    q = make(redis_server, pool, prefix)

    async def status() -> State:
        return await (await q.enqueue("h", model="m", vram_gb=1)).status()

    first = asyncio.new_event_loop()
    try:
        assert first.run_until_complete(status()) is State.QUEUED
        with pytest.raises(ConfigError, match="belongs to the event loop of its first call"):
            run(status())
        assert first.run_until_complete(status()) is State.QUEUED
    finally:
        first.run_until_complete(q.close())
        first.close()
