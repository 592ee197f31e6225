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
from helpers import T0, enqueue, enqueue_specs, register_worker

from gpuq import Config, Queue, bulk
from gpuq.aio import AsyncQueue
from gpuq.bulk import BULK_CHUNK
from gpuq.embedded import EmbeddedServer
from gpuq.errors import ConfigError, DuplicateTask, InvalidTask, PartialEnqueue, UnregisteredHandler
from gpuq.task import build_specs
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
    ({"tenant": "capped", "vram_gb": 20}, InvalidTask, "tenant capped could never run it"),
])
def test_a_later_task_the_pool_would_refuse_writes_nothing(queue: Queue, last: dict[str, Any],
                                                           error: type, fragment: str) -> None:
    queue.enqueue("h", model="m", vram_gb=1, task_id="taken")
    queue.enqueue("h", model="m", vram_gb=1, task_id="ended", max_attempts=1)
    queue.scripts.run(queue.calls.cancel("ended"))
    queue.redis.hset(queue.keys.task("ended"), "state", "failed")
    set_tenant(queue, Tenant("default", 1.0))
    set_tenant(queue, Tenant("capped", 1.0, max_vram_gb=10))
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


def test_a_later_call_failing_all_the_same_names_what_was_enqueued(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal the preflight did not see coming (the pool changed between its check and
    the calls): here check_fit's handlers, with the preflight's look at them skipped."""
    monkeypatch.setattr(bulk.Fits, "check", lambda self, i, s: None)
    register_worker(queue, "w1")
    enqueue(queue, T0)
    before = stored(queue)
    with pytest.raises(PartialEnqueue, match=f"{2 * BULK_CHUNK} of {N} tasks were enqueued") as caught:
        queue.enqueue_many(tasks({"handler": "unknown"}), check_fit=True)
    assert isinstance(caught.value.cause, UnregisteredHandler)
    assert len(caught.value.enqueued) == 2 * BULK_CHUNK == stored(queue) - before
    assert all(t.status().value == "queued" for t in caught.value.enqueued[:3])


def numbered(stem: str) -> list[dict[str, Any]]:
    return [{**t, "task_id": f"{stem}{i}"} for i, t in enumerate(tasks())]


def others_take(monkeypatch: pytest.MonkeyPatch, queue: Queue, taken: list[dict[str, Any]]) -> None:
    """Another producer enqueues ``taken`` just after the bulk's check of the pool's state,
    before its calls (two bulks of the same ids at once)."""
    check = bulk.Preflight.check

    def then_taken(flight: bulk.Preflight, replies: Any) -> bool:
        found = check(flight, replies)
        enqueue_specs(queue, build_specs(taken))
        return found

    monkeypatch.setattr(bulk.Preflight, "check", then_taken)


def test_a_bulk_names_only_the_tasks_it_wrote_when_another_took_ids_meanwhile(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the tasks named were every id the server held, the other producer's too
    (450 of 450 enqueued, where this bulk's second call was refused and wrote nothing)."""
    batch = numbered("c")
    others_take(monkeypatch, queue, batch[BULK_CHUNK:2 * BULK_CHUNK])  # the second call's ids
    with pytest.raises(PartialEnqueue, match=f"{N - BULK_CHUNK} of {N} tasks") as caught:
        queue.enqueue_many(batch)
    assert isinstance(caught.value.cause, DuplicateTask)
    mine = [t["task_id"] for t in batch[:BULK_CHUNK] + batch[2 * BULK_CHUNK:]]
    assert [t.id for t in caught.value.enqueued] == mine


def test_a_bulk_that_wrote_nothing_says_so_when_another_took_every_id(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    batch = numbered("d")
    for i in range(0, N, BULK_CHUNK):  # the other producer's own calls, of one chunk each
        others_take(monkeypatch, queue, batch[i:i + BULK_CHUNK])
    with pytest.raises(DuplicateTask):  # not PartialEnqueue naming all N
        queue.enqueue_many(batch)


@pytest.mark.parametrize("timeout", [math.nan, -1, "1", True])
def test_a_result_wait_refuses_a_timeout_that_is_no_duration(queue: Queue, timeout: object) -> None:
    t = queue.enqueue("h", model="m", vram_gb=1)
    with pytest.raises(ConfigError, match="timeout must be seconds"):
        t.result(timeout=timeout)  # type: ignore[arg-type]


def test_the_asyncio_client_checks_and_tells_the_same(redis_server: EmbeddedServer, pool: str,
                                                      prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
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
            with pytest.raises(UnregisteredHandler, match=f"task {N - 1} of the batch"):
                await q.enqueue_many(tasks({"handler": "unknown"}), check_fit=True)
            assert await q.redis.zcard(q.keys.queue(2, "m")) == 1  # nothing more written
            batch = numbered("a")
            others_take(monkeypatch, sync, batch[BULK_CHUNK:2 * BULK_CHUNK])
            with pytest.raises(PartialEnqueue) as caught:
                await q.enqueue_many(batch)
            assert len(caught.value.enqueued) == N - BULK_CHUNK
            with pytest.raises(ConfigError):
                await (await q.enqueue("h", model="m", vram_gb=1)).result(timeout=-1)
        finally:
            await q.close()

    asyncio.run(scenario())
