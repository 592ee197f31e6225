"""A wait riding out an outage stops when the queue is closed during its pause: it raises
instead of trying again through the closed pool (which would open connections that close()
never closes, and go on waiting until its timeout once Redis is back)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis

from gpuq.aio import AsyncQueue
from gpuq.client import Queue
from gpuq.connection import connect_async
from gpuq.errors import ConnectionFailed
from gpuq.producer import Waiting


def test_async_wait_closed_during_its_outage_pause_raises_without_trying_again() -> None:
    async def scenario() -> int:
        q = AsyncQueue(connect_async("redis://127.0.0.1:1/0"))
        calls = 0

        async def read() -> str:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise redis.ConnectionError("Connection closed by server.")
            return "answered"  # Redis back: a try after close() would get through

        wait = asyncio.ensure_future(q._ridden(Waiting("t", 10), read))
        await asyncio.sleep(0.03)  # the first try failed: it pauses 0.1 s
        await q.close()
        with pytest.raises(ConnectionFailed):
            await wait
        return calls

    assert asyncio.run(scenario()) == 1


def test_sync_wait_closed_during_its_outage_pause_raises_without_trying_again() -> None:
    q = Queue(redis.Redis(port=1, decode_responses=True))
    calls = 0

    def read() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise redis.ConnectionError("Connection closed by server.")
        return "answered"

    closer = threading.Timer(0.03, q.close)
    closer.start()
    with pytest.raises(ConnectionFailed):
        q._ridden(Waiting("t", 10), read)
    closer.join()
    assert calls == 1


def test_a_wait_or_stream_read_after_close_raises_without_reconnecting() -> None:
    """A stream whose reader was busy when the queue closed read on through the closed pool,
    reconnecting a connection nothing closes (likewise a wait's next round trip)."""
    def never() -> str:
        raise AssertionError("read after close")

    async def never_async() -> str:
        raise AssertionError("read after close")

    async def scenario() -> None:
        q = AsyncQueue(connect_async("redis://127.0.0.1:1/0"))
        await q.close()
        with pytest.raises(ConnectionFailed, match="closed"):
            await q._ridden(Waiting("t", 10), never_async)

    asyncio.run(scenario())
    q = Queue(redis.Redis(port=1, decode_responses=True))
    q.close()
    with pytest.raises(ConnectionFailed, match="closed"):
        q._ridden(Waiting("t", 10), never)
