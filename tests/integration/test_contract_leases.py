"""Contract suite, part 2: leases and fencing, retries, cancel, result waits, reap.

Runs on fakeredis and on the real server (``backend``); the tests that block on BLPOP while
another thread acts use the real server only (``real_queue``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers import T0, ack, claim, enqueue, fail, heartbeat, reap

from gpuq import Queue
from gpuq.errors import (
    InvalidTask,
    NotRequeueable,
    ResultTimeout,
    StaleLease,
    TaskAlreadyFinished,
    TaskFailed,
    TaskNotFound,
)
from gpuq.reaper import Reaper
from gpuq.scripts import ReapResult
from gpuq.task import State
from gpuq.work_index import member

LEASE_MS = 30_000  # Config.lease_s default
MakeQueue = Callable[..., Queue]


def claimed(queue: Queue, worker: str = "w1", now_ms: int = T0, **kw: Any) -> dict[str, str]:
    c = claim(queue, worker, 40, now_ms=now_ms, **kw)
    assert c is not None
    return c


def test_ack_with_a_wrong_token_is_rejected_and_changes_nothing(queue: Queue) -> None:
    tid = enqueue(queue, T0)
    c = claimed(queue)
    with pytest.raises(StaleLease) as err:
        ack(queue, tid, int(c["token"]) + 1, "forged", now_ms=T0 + 5)
    assert err.value.task_id == tid
    r = queue.record(tid)
    assert r.state is State.RUNNING and r.result is None and r.token == int(c["token"])
    ack(queue, tid, c["token"], "real", now_ms=T0 + 6)
    with pytest.raises(StaleLease):
        ack(queue, tid, c["token"], "twice", now_ms=T0 + 7)
    assert queue.record(tid).result == "real"


@pytest.mark.parametrize("result", ["{not json", "", "nan", "0x10", "-inf"])
def test_ack_with_a_non_json_result_is_invalid(queue: Queue, result: str) -> None:
    tid = enqueue(queue, T0)
    c = claimed(queue)
    with pytest.raises(InvalidTask):
        queue.scripts.run(queue.calls.ack(tid, int(c["token"]), result, now_ms=T0 + 1))
    r = queue.record(tid)
    assert r.state is State.RUNNING and r.result is None


def test_ack_of_an_unknown_task_is_not_found(queue: Queue) -> None:
    with pytest.raises(TaskNotFound):
        ack(queue, "nope", 1)


def test_ack_after_reap_recovered_an_expired_lease_is_rejected(queue: Queue) -> None:
    tid = enqueue(queue, T0)
    first = claimed(queue, "w1")
    assert reap(queue, now_ms=T0 + LEASE_MS - 1).requeued == 0  # lease still live
    got = reap(queue, now_ms=T0 + LEASE_MS + 1)
    assert got == ReapResult(1, 0, 0, 0) and got.recovered == (("", tid, "queued"),)
    r = queue.record(tid)
    assert r.state is State.QUEUED and r.attempt == 1 and r.error == "lease expired"
    assert r.worker is None and r.token is None
    with pytest.raises(StaleLease):
        ack(queue, tid, first["token"], "late", now_ms=T0 + LEASE_MS + 2)
    assert heartbeat(queue, "w1", [(tid, first["token"])], now_ms=T0 + LEASE_MS + 2) == [tid]
    second = claimed(queue, "w2", now_ms=T0 + LEASE_MS + 3)
    assert second["id"] == tid and second["attempt"] == "2"
    assert int(second["token"]) > int(first["token"])
    with pytest.raises(StaleLease):
        ack(queue, tid, first["token"], "late again", now_ms=T0 + LEASE_MS + 4)
    ack(queue, tid, second["token"], "done", now_ms=T0 + LEASE_MS + 5)
    assert queue.record(tid).result == "done"
    once = enqueue(queue, T0, max_attempts=1)  # its one attempt spent: failed, said in the singular
    claimed(queue, "w1", now_ms=T0 + LEASE_MS + 6)
    reap(queue, now_ms=T0 + 2 * LEASE_MS + 7)
    assert queue.record(once).error == "worker w1 died (after 1 attempt)"


def test_heartbeat_renews_a_lease_past_its_first_expiry(queue: Queue) -> None:
    tid = enqueue(queue, T0)
    c = claimed(queue)
    assert heartbeat(queue, "w1", [(tid, c["token"])], now_ms=T0 + 20_000) == []
    assert reap(queue, now_ms=T0 + LEASE_MS + 1).requeued == 0
    assert queue.record(tid).state is State.RUNNING


def test_fail_retries_after_backoff_then_fails_for_good(make_queue: MakeQueue) -> None:
    q = make_queue(retry_base_s=1.0, retry_max_s=60.0)
    tid = enqueue(q, T0, max_attempts=3)
    c = claimed(q, "w")
    assert fail(q, tid, c["token"], "oom", now_ms=T0 + 10) == "delayed"
    r = q.record(tid)
    assert r.state is State.DELAYED and r.error == "oom" and r.worker is None and r.attempt == 1
    assert q.redis.zscore(q.keys.delayed, tid) == T0 + 10 + 1000  # base * 2^0
    assert claim(q, "w", 40, now_ms=T0 + 1009) is None  # backoff not over
    assert reap(q, now_ms=T0 + 1010).promoted == 1  # promoted by the reaper
    assert q.record(tid).state is State.QUEUED

    c = claimed(q, "w", now_ms=T0 + 1010)
    assert c["attempt"] == "2" and q.record(tid).error is None  # a claim clears the error
    assert fail(q, tid, c["token"], "oom", now_ms=T0 + 1020) == "delayed"
    assert q.redis.zscore(q.keys.delayed, tid) == T0 + 1020 + 2000  # base * 2^1
    assert claim(q, "w", 40, now_ms=T0 + 1020 + 1999) is None
    c = claimed(q, "w", now_ms=T0 + 1020 + 2000)  # promoted by the claim itself
    assert c["id"] == tid and c["attempt"] == "3"

    assert fail(q, tid, c["token"], "oom again", now_ms=T0 + 4000) == "failed"
    r = q.record(tid)
    assert r.state is State.FAILED and r.error == "oom again" and r.attempt == 3
    assert r.finished_at == (T0 + 4000) / 1000
    with pytest.raises(TaskFailed) as err:
        q.task(tid).result(timeout=1)
    assert (err.value.state, err.value.error) == ("failed", "oom again")


def test_a_first_claim_writes_no_error_and_a_retry_s_claim_clears_it(make_queue: MakeQueue) -> None:
    """Claim clears the error of an attempt before; a task it read whole (its model held here)
    that has none gets no empty field (one field more for each later lookup of the hash to
    walk: docs/PROTOCOL.md, the task hash)."""
    q = make_queue(retry_base_s=1.0)
    tid = enqueue(q, T0)
    key = q.keys.task(tid)
    c = claimed(q, "w", loaded=[("A", 1.0)])
    assert not q.redis.hexists(key, "error") and q.redis.hget(key, "state") == "running"
    assert fail(q, tid, c["token"], "oom", now_ms=T0 + 10) == "delayed"
    assert q.redis.hget(key, "error") == "oom"
    claimed(q, "w", now_ms=T0 + 1010, loaded=[("A", 1.0)])  # the retry, promoted by the claim
    assert q.redis.hget(key, "error") == "" and q.record(tid).attempt == 2


def test_fail_without_retry_ends_at_once_and_a_stale_fail_is_rejected(queue: Queue) -> None:
    tid = enqueue(queue, T0, max_attempts=5)
    c = claimed(queue)
    with pytest.raises(StaleLease):
        fail(queue, tid, int(c["token"]) + 1, "forged")
    assert fail(queue, tid, c["token"], "bad input", retry=False, now_ms=T0 + 1) == "failed"
    assert queue.record(tid).state is State.FAILED
    with pytest.raises(StaleLease):
        fail(queue, tid, c["token"], "again")


def test_a_task_passed_on_gives_its_attempt_back_and_waits_the_pass(queue: Queue) -> None:
    """A worker whose app lacks the handler passes the task on (gpuq/worker/passing.py):
    no attempt used, even on the last one, and it waits the pass, not a backoff."""
    tid = enqueue(queue, T0, max_attempts=1)
    c = claimed(queue, "w")
    assert fail(queue, tid, c["token"], "handler 'x' is not registered", now_ms=T0 + 10,
                pass_ms=1000) == "passed"
    r = queue.record(tid)
    assert r.state is State.DELAYED and r.attempt == 0 and r.worker is None
    assert r.error == "handler 'x' is not registered"
    assert queue.redis.zscore(queue.keys.delayed, tid) == T0 + 10 + 1000
    assert claim(queue, "w", 40, now_ms=T0 + 1009) is None
    c = claimed(queue, "w", now_ms=T0 + 1010)
    assert c["id"] == tid and c["attempt"] == "1"
    ack(queue, tid, c["token"], 1, now_ms=T0 + 1020)
    assert queue.record(tid).state is State.SUCCEEDED


def test_cancel_a_queued_task(queue: Queue) -> None:
    tid = enqueue(queue, T0, model="A", priority="P1")
    assert queue.cancel(tid) == "queued"
    r = queue.record(tid)
    assert r.state is State.CANCELED and r.error == "canceled" and r.finished_at is not None
    assert queue.redis.zcard(queue.keys.queue(1, "A")) == 0
    assert queue.redis.zscore(queue.keys.models_with_work, member(1, "A")) is None
    assert queue.redis.zscore(queue.keys.need, tid) is None
    assert claim(queue, "w1", 40, now_ms=T0 + 1) is None


def test_cancel_a_delayed_task(queue: Queue) -> None:
    tid = enqueue(queue, T0)
    c = claimed(queue)
    assert fail(queue, tid, c["token"], "oom", now_ms=T0 + 1) == "delayed"
    assert queue.cancel(tid) == "delayed"
    assert queue.redis.zscore(queue.keys.delayed, tid) is None
    assert reap(queue, now_ms=T0 + 10 * 60_000).promoted == 0
    assert queue.record(tid).state is State.CANCELED


def test_cancel_a_running_task_makes_its_heartbeat_report_it_lost(queue: Queue) -> None:
    tid = enqueue(queue, T0)
    c = claimed(queue)
    assert queue.cancel(tid) == "running"
    # its worker is told at once, fenced by the run's token; the beat still reports it
    assert queue.redis.lrange(queue.keys.control("w1"), 0, -1) == [f"lost {tid} {c['token']}"]
    assert heartbeat(queue, "w1", [(tid, c["token"])], now_ms=T0 + 5) == [tid]
    with pytest.raises(StaleLease):
        ack(queue, tid, c["token"], "too late", now_ms=T0 + 6)
    assert queue.redis.zscore(queue.keys.running, tid) is None
    assert queue.redis.smembers(queue.keys.worker_tasks("w1")) == set()
    assert queue.record(tid).state is State.CANCELED


def test_an_operators_requeue_of_a_running_task_tells_its_worker_at_once(queue: Queue) -> None:
    tid = enqueue(queue, T0)
    c = claimed(queue)
    assert queue.scripts.run(queue.calls.requeue(tid, None, "again", now_ms=T0 + 1)) == "queued"
    assert queue.redis.lrange(queue.keys.control("w1"), 0, -1) == [f"lost {tid} {c['token']}"]
    # a worker's own requeue (its token: a yield, a shutdown) tells nobody
    c = claimed(queue, "w2", now_ms=T0 + 2)
    assert queue.scripts.run(queue.calls.requeue(tid, int(c["token"]), "yielded", preempted="yielded",
                                                 now_ms=T0 + 3)) == "queued"
    assert queue.redis.llen(queue.keys.control("w2")) == 0


def test_cancel_of_a_finished_or_unknown_task(queue: Queue) -> None:
    tid = enqueue(queue, T0)
    c = claimed(queue)
    ack(queue, tid, c["token"], 1)
    with pytest.raises(TaskAlreadyFinished) as err:
        queue.cancel(tid)
    assert (err.value.task_id, err.value.state) == (tid, "succeeded")
    assert queue.record(tid).result == 1
    with pytest.raises(TaskNotFound):
        queue.cancel("no-such-task")


def test_result_of_a_canceled_task_raises(queue: Queue) -> None:
    t = queue.enqueue("h", model="A", vram_gb=1)
    t.cancel()
    with pytest.raises(TaskFailed) as err:
        t.result(timeout=1)
    assert err.value.state == "canceled"


def test_result_of_an_unknown_task_raises_and_a_null_result_is_none(queue: Queue) -> None:
    with pytest.raises(TaskNotFound):
        queue.task("no-such-task").result(timeout=1)
    tid = enqueue(queue, T0)
    c = claimed(queue)
    ack(queue, tid, c["token"], None)
    assert queue.task(tid).result(timeout=1) is None


def test_result_times_out(queue: Queue) -> None:
    t = queue.enqueue("h", model="A", vram_gb=1)
    start = time.monotonic()
    with pytest.raises(ResultTimeout) as err:
        t.result(timeout=0.3)
    assert err.value.task_id == t.id and time.monotonic() - start >= 0.25


def later(seconds: float, action: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        time.sleep(seconds)
        action()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_result_blocks_until_another_thread_acks(real_queue: Queue) -> None:
    t = real_queue.enqueue("h", model="A", vram_gb=1)

    def work() -> None:
        c = claim(real_queue, "w1", 10)
        assert c is not None
        ack(real_queue, t.id, c["token"], {"n": 1})

    thread = later(0.2, work)
    start = time.monotonic()
    assert t.result(timeout=10) == {"n": 1}
    assert 0.15 < time.monotonic() - start < 5
    thread.join(5)


def test_result_wakes_every_waiter_on_cancel(real_queue: Queue) -> None:
    t = real_queue.enqueue("h", model="A", vram_gb=1)
    outcomes: list[str] = []

    def wait() -> None:
        try:
            t.result(timeout=10)
        except TaskFailed as exc:
            outcomes.append(exc.state)

    waiters = [threading.Thread(target=wait, daemon=True) for _ in range(2)]
    for w in waiters:
        w.start()
    later(0.2, t.cancel).join(5)
    for w in waiters:
        w.join(5)
    assert outcomes == ["canceled", "canceled"]


# Regression: reap once recovered a dead worker's tasks before removing the worker from
# `idle` and `holders:`, so push() offered each requeued task back to the dead worker and
# live workers deferred it for the whole defer bound instead of taking it at once.
def test_reap_requeues_a_dead_workers_tasks_at_once(queue: Queue) -> None:
    tid = enqueue(queue, T0)
    assert heartbeat(queue, "w1", [], now_ms=T0) == []  # registered: alive until T0 + lease
    queue.redis.hset(queue.keys.worker("w1"), "models", "A")
    queue.redis.sadd(queue.keys.holders("A"), "w1")
    c = claimed(queue, "w1", now_ms=T0 + 20_000, slots=2, loaded=[("A", 0.5)])
    assert c["id"] == tid and queue.redis.zscore(queue.keys.idle, "w1") is not None
    # w1 stops heartbeating; its liveness ends at T0 + 30 s, the lease at T0 + 50 s
    assert reap(queue, now_ms=T0 + LEASE_MS - 1) == ReapResult(0, 0, 0, 0)
    got = reap(queue, now_ms=T0 + LEASE_MS + 1)
    assert got == ReapResult(1, 0, 1, 0) and got.recovered == (("w1", tid, "queued"),)
    r = queue.record(tid)
    assert r.state is State.QUEUED and r.attempt == 1 and r.worker is None
    assert r.error == "worker w1 died"
    k = queue.keys
    assert queue.redis.zscore(k.idle, "w1") is None and queue.redis.zscore(k.workers, "w1") is None
    assert not queue.redis.sismember(k.holders("A"), "w1")
    assert queue.redis.exists(k.worker("w1"), k.worker_tasks("w1"), k.wake("w1")) == 0
    assert queue.redis.zscore(k.running, tid) is None
    c = claimed(queue, "w2", now_ms=T0 + LEASE_MS + 2)
    assert c["id"] == tid and c["attempt"] == "2"


def test_a_task_whose_lease_is_lost_max_attempts_times_fails(queue: Queue) -> None:
    tid = enqueue(queue, T0, max_attempts=2)
    now = T0
    results = []
    for attempt in (1, 2):
        c = claimed(queue, f"w{attempt}", now_ms=now)
        assert c["id"] == tid and c["attempt"] == str(attempt)
        now += LEASE_MS + 1
        results.append(reap(queue, now_ms=now))
    assert results == [ReapResult(1, 0, 0, 0), ReapResult(0, 1, 0, 0)]
    assert [r.recovered for r in results] == [(("", tid, "queued"),), (("", tid, "failed"),)]
    r = queue.record(tid)
    assert r.state is State.FAILED and r.attempt == 2
    assert r.error is not None and "lease expired" in r.error and "2 attempts" in r.error
    assert queue.redis.zscore(queue.keys.running, tid) is None
    with pytest.raises(TaskFailed):
        queue.task(tid).result(timeout=1)


def test_operator_requeue_gives_the_attempt_back_and_fences_the_old_lease(queue: Queue) -> None:
    tid = enqueue(queue, T0)
    c = claimed(queue)
    assert queue.requeue(tid) == "queued"
    r = queue.record(tid)
    assert r.state is State.QUEUED and r.attempt == 0 and r.error == "requeued by operator"
    with pytest.raises(StaleLease):
        ack(queue, tid, c["token"], "stale")
    with pytest.raises(NotRequeueable, match="task is queued: there is nothing to requeue"):
        queue.requeue(tid)  # not running any more


def test_retire_keeps_min_workers_and_a_late_heartbeat_does_not_revive(make_queue: MakeQueue) -> None:
    q = make_queue(min_workers=1)
    for w in ("a", "b"):
        heartbeat(q, w, [], now_ms=T0)
    retired, live = q.scripts.run(q.calls.retire("a", now_ms=T0 + 1))
    assert (retired, live) == (True, 2)
    heartbeat(q, "a", [], now_ms=T0 + 2)  # a beat already on its way when it retired
    assert q.redis.zscore(q.keys.workers, "a") is None
    # b is now the last live worker: it stays
    assert q.scripts.run(q.calls.retire("b", now_ms=T0 + 3)) == (False, 1)
    q.redis.hset(q.keys.settings, "min_workers", 0)  # the reaper's setting wins
    assert q.scripts.run(q.calls.retire("b", now_ms=T0 + 4)) == (True, 1)


def test_a_draining_worker_does_not_count_toward_min_workers(make_queue: MakeQueue) -> None:
    """Regression: an idle worker retired while the only other live one was draining (its
    hash says so from its next beat): both left, the pool fell below min_workers."""
    q = make_queue(min_workers=1)
    for w in ("idle", "leaving"):
        heartbeat(q, w, [], now_ms=T0)
    q.redis.hset(q.keys.worker("leaving"), "state", "draining")
    assert q.scripts.run(q.calls.retire("idle", now_ms=T0 + 1)) == (False, 2)
    q.redis.hset(q.keys.worker("leaving"), "state", "busy")
    assert q.scripts.run(q.calls.retire("idle", now_ms=T0 + 2)) == (True, 2)


def test_the_reaper_names_each_dead_worker_and_what_became_of_each_task(
        queue: Queue, caplog: pytest.LogCaptureFixture) -> None:
    """An operator reading the reaper's log learns which workers died and which tasks went
    back (or ended), not only how many: a line per dead worker, one per expired lease."""
    died_with = enqueue(queue, T0)
    heartbeat(queue, "w1", [], now_ms=T0)  # alive until T0 + lease: long past on the server's clock
    claimed(queue, "w1", now_ms=T0 + 1)
    heartbeat(queue, "w2", [], now_ms=T0)  # died running nothing
    lapsed = enqueue(queue, T0)
    claimed(queue, "w3", now_ms=T0 + 2)
    queue.redis.zrem(queue.keys.workers, "w3")  # its liveness already forgotten: only the lease is left
    with caplog.at_level(logging.WARNING, logger="gpuq.reaper"):
        got = Reaper(queue.redis, queue.config).reap_once()
    assert (got.requeued, got.dead_workers) == (2, 2)
    pool = queue.config.pool
    assert f"reaper.worker_dead pool={pool} worker=w1 tasks={died_with}:queued" in caplog.text
    assert f"reaper.worker_dead pool={pool} worker=w2 tasks=none" in caplog.text
    assert f"reaper.lease_expired pool={pool} tasks={lapsed}:queued" in caplog.text
