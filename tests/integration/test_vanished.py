"""A task deleted under a caller (a flush, an eviction, an operator's DEL, a result TTL of 0)
pushes no done list and ends no stream: a result wait, a wait and a stream read find it gone
at their next wake-up, within ``Waiting.MAX_BLOCK_S``, and raise TaskNotFound, sync and
asyncio alike (they blocked 60 s, and a stream read until its timeout, forever without one).

Real server only: the callers block while the test deletes the tasks.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuq import Config, Queue
from gpuq.aio import AsyncQueue
from gpuq.embedded import EmbeddedServer
from gpuq.errors import TaskNotFound

# far past one wake-up (Waiting.MAX_BLOCK_S, 5 s), far short of the 60 s a wait blocked (a
# stream read: no end at all); a bound on a hang, not a measure of speed
LIMIT_S = 20.0


def blocked_clients(q: Queue) -> int:
    return int(q.redis.info("clients")["blocked_clients"])


def delete_once_blocked(q: Queue, ids: list[str], before: int) -> None:
    """Delete the tasks' hashes once every caller blocks on the server."""
    until = time.monotonic() + 30
    while blocked_clients(q) < before + len(ids):
        assert time.monotonic() < until, "the callers never blocked"
        time.sleep(0.02)
    q.redis.delete(*(q.keys.task(i) for i in ids))


def test_waits_and_stream_reads_on_a_deleted_task_raise_task_not_found(
    redis_server: EmbeddedServer, pool: str, prefix: str
) -> None:
    # from_url's client, as a user's: no read timeout (one would cap each block itself)
    with Queue.from_url(redis_server.url, pool, Config(prefix=prefix)) as q:
        called(q)


def called(q: Queue) -> None:
    """A result wait, a wait and a stream read, each in a thread, on tasks deleted under them."""
    ids = [q.enqueue("h", model="m", vram_gb=1).id for _ in range(3)]
    callers: dict[str, Callable[[], Any]] = {
        "result": lambda: q.result(ids[0]),
        "wait": lambda: q.wait(ids[1]),
        "stream": lambda: list(q.stream(ids[2])),
    }
    outcomes: dict[str, object] = {}

    def run(name: str) -> None:
        try:
            outcomes[name] = callers[name]()
        except Exception as exc:
            outcomes[name] = exc

    before = blocked_clients(q)
    threads = [threading.Thread(target=run, args=(name,), daemon=True) for name in callers]
    for thread in threads:
        thread.start()
    delete_once_blocked(q, ids, before)
    until = time.monotonic() + LIMIT_S
    for thread in threads:
        thread.join(max(0.0, until - time.monotonic()))
    assert sorted(outcomes) == sorted(callers), "a caller still blocks on a deleted task"
    assert all(isinstance(o, TaskNotFound) for o in outcomes.values()), outcomes


def test_the_asyncio_client_finds_a_deleted_task_gone_too(
    redis_server: EmbeddedServer, pool: str, prefix: str, real_queue: Queue
) -> None:
    admin = real_queue

    async def stream(q: AsyncQueue, task_id: str) -> list[Any]:
        return [c async for c in q.stream(task_id)]

    async def scenario() -> list[Any]:
        async with AsyncQueue.from_url(redis_server.url, pool=pool, config=Config(prefix=prefix)) as q:
            ids = [(await q.enqueue("h", model="m", vram_gb=1)).id for _ in range(3)]
            before = blocked_clients(admin)
            calls = [q.result(ids[0]), q.wait(ids[1]), stream(q, ids[2])]
            waits = [asyncio.ensure_future(asyncio.wait_for(c, LIMIT_S)) for c in calls]
            await asyncio.to_thread(delete_once_blocked, admin, ids, before)
            return await asyncio.gather(*waits, return_exceptions=True)

    outcomes = asyncio.run(scenario())
    assert all(isinstance(o, TaskNotFound) for o in outcomes), outcomes
