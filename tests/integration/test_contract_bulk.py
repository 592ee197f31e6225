"""Contract suite: a bulk enqueue of several calls is all or nothing, or says what it wrote.

Runs on fakeredis and on the real server (``backend``), the asyncio client on the real
server. A bulk larger than one call (``gpuq.bulk.BULK_CHUNK`` tasks) that the pool's state
would refuse in a later call writes nothing; one that fails all the same after its first
calls raises PartialEnqueue with the tasks it stored (gpuq.bulk).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import redis
from helpers import T0, enqueue, register_worker

from gpuq import Config, Queue
from gpuq.aio import AsyncQueue
from gpuq.bulk import BULK_CHUNK
from gpuq.embedded import EmbeddedServer
from gpuq.errors import ConfigError, DuplicateTask, InvalidTask, PartialEnqueue, UnregisteredHandler
from gpuq.tenants import Tenant, require_registered, set_tenant

N = 2 * BULK_CHUNK + 50  # three calls


def tasks(last: dict[str, Any] | None = None, **common: Any) -> list[dict[str, Any]]:
    out = [{"handler": "h", "model": "m", "vram_gb": 1, **common} for _ in range(N)]
    out[-1].update(last or {})
    return out


def stored(q: Queue) -> int:
    return sum(1 for _ in q.redis.scan_iter(match=q.keys.task("*")))


@pytest.mark.parametrize("last, error, fragment", [
    ({"task_id": "taken"}, DuplicateTask, "taken already exists"),
    ({"after": ["nope"]}, InvalidTask, "unknown parent task nope"),
    ({"after": ["ended"]}, InvalidTask, "parent task ended ended failed"),
    ({"at": 1.0}, InvalidTask, "at is in the past"),
    ({"tenant": "ghost"}, InvalidTask, "tenant ghost is not registered"),
])
def test_a_later_task_the_pool_would_refuse_writes_nothing(queue: Queue, last: dict[str, Any],
                                                           error: type, fragment: str) -> None:
    queue.enqueue("h", model="m", vram_gb=1, task_id="taken")
    queue.enqueue("h", model="m", vram_gb=1, task_id="ended", max_attempts=1)
    queue.scripts.run(queue.calls.cancel("ended"))
    queue.redis.hset(queue.keys.task("ended"), "state", "failed")
    set_tenant(queue, Tenant("default", 1.0))
    require_registered(queue, True)
    before = stored(queue)
    with pytest.raises(error, match=fragment):
        queue.enqueue_many(tasks(last))
    assert stored(queue) == before


def test_parents_earlier_in_the_bulk_are_known_and_later_ones_not(queue: Queue) -> None:
    batch = tasks(task_id="x")  # ids given below
    for i, t in enumerate(batch):
        t["task_id"] = f"t{i}"
    batch[-1]["after"] = ["t0"]
    assert len(queue.enqueue_many(batch)) == N
    batch = [{**t, "task_id": f"u{i}"} for i, t in enumerate(batch)]
    batch[0]["after"] = [f"u{N - 1}"]
    with pytest.raises(InvalidTask, match=f"unknown parent task u{N - 1}"):
        queue.enqueue_many(batch)


def test_a_later_call_failing_all_the_same_names_what_was_enqueued(queue: Queue) -> None:
    """check_fit's classes and handlers are not looked at before the calls."""
    register_worker(queue, "w1")
    enqueue(queue, T0)
    before = stored(queue)
    with pytest.raises(PartialEnqueue, match=f"{2 * BULK_CHUNK} of {N} tasks were enqueued") as caught:
        queue.enqueue_many(tasks({"handler": "unknown"}), check_fit=True)
    assert isinstance(caught.value.cause, UnregisteredHandler)
    assert len(caught.value.enqueued) == 2 * BULK_CHUNK == stored(queue) - before
    assert all(t.status().value == "queued" for t in caught.value.enqueued[:3])


@pytest.mark.parametrize("timeout", [math.nan, -1, "1", True])
def test_a_result_wait_refuses_a_timeout_that_is_no_duration(queue: Queue, timeout: object) -> None:
    t = queue.enqueue("h", model="m", vram_gb=1)
    with pytest.raises(ConfigError, match="timeout must be seconds"):
        t.result(timeout=timeout)  # type: ignore[arg-type]


def test_the_asyncio_client_checks_and_tells_the_same(redis_server: EmbeddedServer, pool: str,
                                                      prefix: str) -> None:
    async def scenario() -> None:
        q = AsyncQueue.from_url(redis_server.url, pool=pool, config=Config(prefix=prefix))
        try:
            await q.enqueue("h", model="m", vram_gb=1, task_id="taken")
            with pytest.raises(DuplicateTask):
                await q.enqueue_many(tasks({"task_id": "taken"}))
            assert await q.redis.zcard(q.keys.queue(2, "m")) == 1
            sync = Queue(redis.Redis.from_url(redis_server.url, decode_responses=True),
                         Config(pool=pool, prefix=prefix))
            register_worker(sync, "w1")
            with pytest.raises(PartialEnqueue) as caught:
                await q.enqueue_many(tasks({"handler": "unknown"}), check_fit=True)
            assert len(caught.value.enqueued) == 2 * BULK_CHUNK
            with pytest.raises(ConfigError):
                await (await q.enqueue("h", model="m", vram_gb=1)).result(timeout=-1)
        finally:
            await q.close()

    asyncio.run(scenario())
