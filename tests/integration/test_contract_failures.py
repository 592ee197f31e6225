"""Contract suite: the `failures` list, the latest tasks that ended failed (``gpuq failures``).

Runs on fakeredis and on the real server (``backend``). A task's final failure is noted in
the call that ends it, whatever ends it (the handler's last attempt, a lost lease on the
last attempt, a corrupt hash); a retry, a success, a cancel or an expiry is not. The list
keeps the newest FAILURES_KEPT entries, and an error's first 200 bytes cut at a whole
character.
"""

from __future__ import annotations

import json
from typing import Any

from conftest import MakeQueue
from helpers import T0, ack, claim, enqueue, fail, reap

from gpuq import Queue
from gpuq.keys import FAILURES_KEPT
from gpuq.views.inspect import recent_failures

LEASE_MS = 30_000  # Config.lease_s default


def run(q: Queue, task_id: str, now_ms: int) -> str:
    """Claim task_id on w1; its fencing token."""
    c = claim(q, "w1", 40, now_ms=now_ms)
    assert c is not None and c["id"] == task_id
    return c["token"]


def stored(q: Queue) -> list[dict[str, Any]]:
    return [json.loads(e) for e in q.redis.lrange(q.keys.failures, 0, -1)]


def test_a_last_attempt_that_fails_is_noted_with_its_task(queue: Queue) -> None:
    tid = enqueue(queue, T0, handler="llm.generate", model="A", priority=1, tenant="shop",
                  max_attempts=2)
    assert fail(queue, tid, run(queue, tid, T0 + 1), "oom", now_ms=T0 + 2) == "delayed"
    assert stored(queue) == []  # a retry is not a failure yet
    assert fail(queue, tid, run(queue, tid, T0 + 600_000), "oom again", now_ms=T0 + 600_001) == "failed"
    assert stored(queue) == [{"id": tid, "handler": "llm.generate", "model": "A", "priority": "P1",
                              "tenant": "shop", "attempt": 2, "error": "oom again",
                              "at": (T0 + 600_001) / 1000}]
    assert recent_failures(queue.redis, queue.keys) == stored(queue)


def test_other_ends_are_not_noted(queue: Queue) -> None:
    done, canceled = enqueue(queue, T0, model="A"), enqueue(queue, T0, model="B")
    ack(queue, done, run(queue, done, T0 + 1), now_ms=T0 + 2)
    queue.scripts.run(queue.calls.cancel(canceled, now_ms=T0 + 3))
    late = enqueue(queue, T0, model="C", deadline_s=1, est_s=0.5)
    queue.scripts.run(queue.calls.expire(now_ms=T0 + 5_000))
    assert queue.record(late).state.value == "expired"
    assert stored(queue) == []


def test_a_lease_lost_on_the_last_attempt_is_noted(queue: Queue) -> None:
    tid = enqueue(queue, T0, model="A", max_attempts=1)
    run(queue, tid, T0)
    reap(queue, now_ms=T0 + LEASE_MS + 1)
    (entry,) = stored(queue)
    assert entry["id"] == tid and entry["attempt"] == 1
    assert "lease expired" in entry["error"] and "(after 1 attempt)" in entry["error"]


def test_a_corrupt_task_failed_by_a_claim_is_noted(queue: Queue) -> None:
    bad = enqueue(queue, T0, model="A")
    queue.redis.hset(queue.keys.task(bad), "vram_gb", "abc")
    assert claim(queue, "w1", 40, now_ms=T0 + 1) is None
    (entry,) = stored(queue)
    assert entry["id"] == bad and entry["model"] == "A" and entry["priority"] == "P2"
    assert entry["error"] == "corrupt task: field vram_gb is missing or malformed"


def test_an_entry_outlives_a_task_kept_for_no_time(make_queue: MakeQueue) -> None:
    q = make_queue(result_ttl_s=0)
    tid = enqueue(q, T0, handler="h2", model="A", max_attempts=1)
    assert fail(q, tid, run(q, tid, T0 + 1), now_ms=T0 + 2) == "failed"
    assert not q.redis.exists(q.keys.task(tid))
    (entry,) = stored(q)
    assert entry["id"] == tid and entry["handler"] == "h2" and entry["model"] == "A"


def test_the_list_keeps_the_newest_and_clips_errors_at_a_character(queue: Queue) -> None:
    queue.redis.lpush(queue.keys.failures, *(json.dumps({"id": f"old{i}"}) for i in range(FAILURES_KEPT)))
    tid = enqueue(queue, T0, model="A", max_attempts=1)
    error = "a" + "é" * 150  # 301 bytes: byte 200 is the first of a two-byte character
    assert fail(queue, tid, run(queue, tid, T0 + 1), error, now_ms=T0 + 2) == "failed"
    entries = stored(queue)
    assert len(entries) == FAILURES_KEPT
    assert entries[0]["id"] == tid and entries[1]["id"] == f"old{FAILURES_KEPT - 1}"
    assert entries[-1]["id"] == "old1"  # the oldest went
    assert entries[0]["error"] == error[:100]  # 199 bytes, not half a character
    assert queue.record(tid).error == error  # the task keeps it whole
