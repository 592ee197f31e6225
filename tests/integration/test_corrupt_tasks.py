"""Task hashes corrupted in Redis (fields deleted or set to garbage, the hash deleted with its
id left behind), on the real server.

A corrupt task must not wedge its queue nor reach a worker: claim fails it (its error names
the field) or drops an id whose hash is gone, and claims the next good task of the same
queue in the same call. The other scripts that read task hashes end such a task the same
way, or carry on without it, and never stop on a Lua error. The last test corrupts one field
of one task of a rich pool state at random (hypothesis) and calls every script on it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from helpers import T0, claim, claim_reply, enqueue, reap, reserve
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from test_fuzz_scripts import Bench, as_bytes, open_bench, valid_calls

from gpuq import Queue
from gpuq.embedded import EmbeddedServer
from gpuq.errors import CorruptTask
from gpuq.keys import Keys
from gpuq.scripts import SCRIPT_NAMES, Claim
from gpuq.task import State, ended_count

BAD = "corrupt task: field {} is missing or malformed"


def corrupt(q: Queue, task_id: str, field: str, value: str | None) -> None:
    """Set a field of a task's hash to value, or delete it (None)."""
    key = q.keys.task(task_id)
    if value is None:
        q.redis.hdel(key, field)
    else:
        q.redis.hset(key, field, value)


def queued_pair(q: Queue) -> None:
    """A task "bad" at the head of queue (P2, A) and a good one behind it."""
    enqueue(q, T0, task_id="bad", model="A", vram_gb=4, est_s=2)
    enqueue(q, T0 + 1, task_id="good", model="A", vram_gb=4, est_s=2)


def assert_failed(q: Queue, task_id: str, field: str) -> None:
    fields = q.redis.hgetall(q.keys.task(task_id))
    assert fields["state"] == State.FAILED.value, fields
    assert fields["error"] == BAD.format(field), fields
    assert q.redis.zscore(q.keys.queue(2, "A"), task_id) is None
    assert q.redis.zscore(q.keys.need, task_id) is None
    assert q.redis.exists(q.keys.done(task_id)) == 0  # nobody waited: no done list
    assert q.scripts.run(q.calls.wait(task_id)) == "failed"  # a waiter's pop returns at once
    assert q.redis.lrange(q.keys.done(task_id), 0, -1) == ["failed"]
    assert q.redis.pttl(q.keys.task(task_id)) > 0


CORRUPTIONS = [
    ("vram_gb", None), ("vram_gb", "abc"), ("vram_gb", "nan"), ("vram_gb", "-1"), ("vram_gb", "0"),
    ("vram_gb", "inf"), ("vram_gb", "0x10"), ("priority", None), ("priority", "7"), ("model", None),
    ("model", "B"), ("handler", None), ("handler", ""), ("payload", None), ("tenant", None),
    ("est_s", "abc"), ("est_s", "-1"), ("attempt", "abc"), ("attempt", "-1"), ("attempt", "1.5"),
    ("max_attempts", "abc"), ("max_attempts", "0"), ("max_attempts", "nan"), ("max_attempts", None),
    ("queued_at", None), ("queued_at", "x"), ("enqueued_at", "1e400"), ("score", "x"),
    ("deadline", "soon"), ("checkpoint", "{not json"),
]


@pytest.mark.parametrize("field, value", CORRUPTIONS)
def test_claim_fails_a_corrupt_task_and_claims_the_next(real_queue: Queue, field: str,
                                                        value: str | None) -> None:
    queued_pair(real_queue)
    corrupt(real_queue, "bad", field, value)
    got = claim(real_queue, "w1", 40, now_ms=T0 + 10_000)
    assert got is not None and got["id"] == "good"
    assert_failed(real_queue, "bad", field)
    stats = real_queue.redis.hgetall(real_queue.keys.stats)
    assert ended_count(stats, "failed") == 1


@pytest.mark.parametrize("field, value", CORRUPTIONS)
def test_a_warm_claim_names_the_corrupt_field_as_a_cold_one(real_queue: Queue, field: str,
                                                             value: str | None) -> None:
    """A held model's task is read whole and its scan's numbers checked once (lib/readable.lua
    takes them): the same task fails, with the same field named, as on the cold path."""
    queued_pair(real_queue)
    corrupt(real_queue, "bad", field, value)
    got = claim(real_queue, "w1", 40, loaded=[("A", 2.0)], now_ms=T0 + 10_000)
    assert got is not None and got["id"] == "good"
    assert_failed(real_queue, "bad", field)


def test_a_deleted_attempt_reads_as_none_yet(real_queue: Queue) -> None:
    """An absent attempt is a task never started (PROTOCOL: absent fields): it runs."""
    queued_pair(real_queue)
    corrupt(real_queue, "bad", "attempt", None)
    got = claim(real_queue, "w1", 40, now_ms=T0 + 10_000)
    assert got is not None and got["id"] == "bad" and got["attempt"] == "1"


def test_an_id_whose_hash_is_gone_leaves_its_queue(real_queue: Queue) -> None:
    queued_pair(real_queue)
    real_queue.redis.delete(real_queue.keys.task("bad"))
    got = claim(real_queue, "w1", 40, now_ms=T0 + 10_000)
    assert got is not None and got["id"] == "good"
    assert not real_queue.redis.exists(real_queue.keys.task("bad"))  # nothing made up for it
    assert real_queue.redis.zcard(real_queue.keys.queue(2, "A")) == 0
    assert real_queue.redis.zcard(real_queue.keys.models_with_work) == 0


def test_a_queue_of_corrupt_tasks_is_cleared_over_claims(real_queue: Queue) -> None:
    """More corrupt tasks than one claim examines: each call clears its scan's worth and the
    good task behind them is reached; nothing stops on the way."""
    for i in range(20):
        enqueue(real_queue, T0 + i, task_id=f"bad{i:02}", model="A", vram_gb=4)
        corrupt(real_queue, f"bad{i:02}", "vram_gb", "abc")
    enqueue(real_queue, T0 + 100, task_id="good", model="A", vram_gb=4)
    for _ in range(3):
        got = claim(real_queue, "w1", 40, now_ms=T0 + 10_000)
        if got is not None:
            break
    assert got is not None and got["id"] == "good"
    assert all(real_queue.redis.hget(real_queue.keys.task(f"bad{i:02}"), "state") == "failed"
               for i in range(20))


def test_a_reserved_corrupt_task_is_failed_and_the_worker_claims_on(real_queue: Queue) -> None:
    queued_pair(real_queue)
    reserve(real_queue, "w1", "bad", T0 + 60_000)
    corrupt(real_queue, "bad", "handler", None)
    got = claim(real_queue, "w1", 40, now_ms=T0 + 10_000)
    assert got is not None and got["id"] == "good"
    assert_failed(real_queue, "bad", "handler")
    assert not real_queue.redis.exists(real_queue.keys.reservation("w1"))


def running(q: Queue, task_id: str = "r1", **options: Any) -> str:
    """A task claimed by worker w1 at T0; returns its token."""
    enqueue(q, T0, task_id=task_id, model="A", vram_gb=4, **options)
    got = claim(q, "w1", 40, now_ms=T0)
    assert got is not None and got["id"] == task_id
    return got["token"]


@pytest.mark.parametrize("field, value", [("max_attempts", "abc"), ("attempt", "x"),
                                          ("priority", None), ("vram_gb", "nan")])
def test_reap_fails_a_corrupt_task_whose_lease_ran_out(real_queue: Queue, field: str,
                                                       value: str | None) -> None:
    running(real_queue)
    corrupt(real_queue, "r1", field, value)
    result = reap(real_queue, now_ms=T0 + 10_000_000)
    assert (result.requeued, result.failed) == (0, 1)
    fields = real_queue.redis.hgetall(real_queue.keys.task("r1"))
    assert fields["state"] == "failed" and fields["error"] == BAD.format(field)
    assert real_queue.redis.zcard(real_queue.keys.running) == 0


def test_a_worker_requeue_of_a_corrupt_task_fails_it(real_queue: Queue) -> None:
    token = running(real_queue)
    corrupt(real_queue, "r1", "score", "x")
    assert real_queue.scripts.run(real_queue.calls.requeue("r1", int(token), "shutdown")) == "failed"
    assert real_queue.redis.hget(real_queue.keys.task("r1"), "error") == BAD.format("score")


def test_an_operator_requeue_of_a_corrupt_task_fails_it(real_queue: Queue) -> None:
    token = running(real_queue)
    real_queue.scripts.run(real_queue.calls.fail("r1", int(token), "boom", retry=False))
    corrupt(real_queue, "r1", "model", None)
    assert real_queue.requeue("r1") == "failed"
    assert real_queue.redis.hget(real_queue.keys.task("r1"), "error") == BAD.format("model")
    assert real_queue.redis.pttl(real_queue.keys.task("r1")) > 0


def test_fail_does_not_retry_a_task_with_corrupt_attempt_counts(real_queue: Queue) -> None:
    token = running(real_queue)
    corrupt(real_queue, "r1", "max_attempts", "many")
    assert real_queue.scripts.run(real_queue.calls.fail("r1", int(token), "boom")) == "failed"
    assert real_queue.redis.hget(real_queue.keys.task("r1"), "error") == "boom"


def test_a_delayed_corrupt_task_is_failed_when_due_and_a_gone_one_dropped(real_queue: Queue) -> None:
    for task_id in ("d1", "d2"):
        token = running(real_queue, task_id)
        assert real_queue.scripts.run(real_queue.calls.fail(task_id, int(token), "x", now_ms=T0)) == "delayed"
    corrupt(real_queue, "d1", "est_s", "slow")
    real_queue.redis.delete(real_queue.keys.task("d2"))
    enqueue(real_queue, T0, task_id="good", model="A", vram_gb=4)
    got = claim(real_queue, "w2", 40, now_ms=T0 + 10_000_000)  # promotes both, then claims
    assert got is not None and got["id"] == "good"
    assert real_queue.redis.hget(real_queue.keys.task("d1"), "error") == BAD.format("est_s")
    assert not real_queue.redis.exists(real_queue.keys.task("d2"))
    assert real_queue.redis.zcard(real_queue.keys.delayed) == 0


@pytest.mark.parametrize("field, value", [("deadline", "soon"), ("est_s", "nan"), ("priority", None),
                                          ("model", None)])
def test_expire_fails_a_corrupt_task_it_watches(real_queue: Queue, field: str, value: str | None) -> None:
    enqueue(real_queue, T0, task_id="bad", model="A", vram_gb=4, deadline_s=5)
    corrupt(real_queue, "bad", field, value)
    expired, looked, kept = real_queue.scripts.run(real_queue.calls.expire(now_ms=T0 + 60_000))
    assert (expired, looked, kept) == (0, 1, 0)  # failed: it left the window
    assert real_queue.redis.hget(real_queue.keys.task("bad"), "error") == BAD.format(field)
    assert real_queue.redis.zcard(real_queue.keys.deadlines) == 0


def test_cancel_of_a_task_without_model_then_claim_drops_its_id(real_queue: Queue) -> None:
    queued_pair(real_queue)
    corrupt(real_queue, "bad", "model", None)
    assert real_queue.cancel("bad") == "queued"
    got = claim(real_queue, "w1", 40, now_ms=T0 + 10_000)  # the stale id leaves the queue
    assert got is not None and got["id"] == "good"
    assert real_queue.redis.hget(real_queue.keys.task("bad"), "state") == "canceled"


def test_ack_of_a_task_without_priority_succeeds(real_queue: Queue) -> None:
    token = running(real_queue)
    corrupt(real_queue, "r1", "priority", None)
    real_queue.scripts.run(real_queue.calls.ack("r1", int(token), "1"))
    assert real_queue.redis.hget(real_queue.keys.task("r1"), "state") == "succeeded"


def test_a_corrupt_task_on_a_busy_holder_does_not_stop_a_claim(real_queue: Queue) -> None:
    """A corrupt running task on a busy holder does not stop another worker's claim, which
    reads the holder's tasks to decide whether to wait for it."""
    running(real_queue, est_s=5)  # w1 holds model A (below) and runs r1
    real_queue.redis.sadd(real_queue.keys.holders("A"), "w1")
    real_queue.redis.hset(real_queue.keys.worker("w1"), mapping={"vram_total_gb": 80, "kv_reserve_gb": 4})
    corrupt(real_queue, "r1", "started_at", "x")
    enqueue(real_queue, T0, task_id="batch", model="A", vram_gb=4, priority=3)
    reply = claim_reply(real_queue, "w2", 40, now_ms=T0 + 10)
    assert reply.task is not None or reply.retry_s > 0


# ---------------------------------------------------------------- one field of the state, at random

EXAMPLES = int(os.environ.get("GPUQ_FUZZ_EXAMPLES", "0")) or 300
TASKS = ["q1", "q2", "q3", "q4", "run1", "run2", "del1", "done1"]
# the fields scripts read first (each twice as likely), then the others
READ = ["vram_gb", "priority", "model", "est_s", "attempt", "max_attempts", "score", "queued_at",
        "enqueued_at", "deadline", "started_at", "state", "worker", "token", "handler"]
FIELDS = [*READ, *READ, "id", "payload", "preemptible", "tenant", "ready_at", "offered", "checkpoint",
          "yield_by", "yield_for", "yield_victim", "reserved_for", "preemptions"]
VALUES = [None, None, "", "abc", "nan", "inf", "-inf", "1e400", "-1", "0", "0x10", "1.5",
          "99999999999999999999", "{", "%", "queued", "running", "w1", "run1"]


def well_formed(task: dict[str, str]) -> None:
    """What claim guarantees of a task it hands out (the worker parses these)."""
    assert task["id"] and task["handler"] and task["model"] and task["priority"] in "0123"
    assert int(task["token"]) > 0 and int(task["attempt"]) >= 1
    for name in ("vram_gb", "est_s"):
        assert math.isfinite(float(task[name])) and float(task[name]) >= 0
    assert float(task["vram_gb"]) > 0
    for name in ("enqueued_at", "queued_at", "started_at"):
        int(task[name])
    assert task["deadline"] == "" or int(task["deadline"]) >= 0
    if task["checkpoint"]:
        json.loads(task["checkpoint"])
    assert isinstance(task["payload"], str) and isinstance(task["tenant"], str)


@pytest.fixture(scope="module")
def bench(redis_server: EmbeddedServer, connect: Callable[[str], redis.Redis],
          prefix: str) -> Iterator[Bench]:
    yield from open_bench(redis_server, connect, prefix)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate, Phase.shrink],
          suppress_health_check=[HealthCheck.too_slow])
@given(task=st.sampled_from(TASKS), field=st.sampled_from(FIELDS), value=st.sampled_from(VALUES),
       name=st.sampled_from(SCRIPT_NAMES), pick=st.integers(0, 3))
def test_any_script_on_a_corrupt_field(bench: Bench, task: str, field: str, value: str | None,
                                       name: str, pick: int) -> None:
    calls = valid_calls(bench.calls)[name]
    call = calls[pick % len(calls)]

    def spoil(keys: Keys) -> None:
        key = keys.task(task)
        if value is None:
            bench.text.hdel(key, field)
        else:
            bench.text.hset(key, field, value)

    reply = bench.check(name, [as_bytes(a) for a in call.args], prepare=spoil)
    if name == "claim":
        got = Claim.parse([x.decode() if isinstance(x, bytes) else x for x in reply])
        if got.task is not None:
            well_formed(got.task)


def test_a_result_wait_on_a_task_with_an_unknown_state_is_a_corrupt_task(real_queue: Queue) -> None:
    """Regression: the wait raised a bare ValueError ('garbage' is not a valid State)."""
    task = real_queue.enqueue("h", model="A", vram_gb=1)
    real_queue.redis.hset(real_queue.keys.task(task.id), "state", "garbage")
    with pytest.raises(CorruptTask, match="field state is 'garbage'"):
        task.result(timeout=0)
