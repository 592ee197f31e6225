"""Deadline expiry: expire.lua under a virtual clock (fakeredis and real Redis), Reaper.expire's
look-ahead for cold model loads, and a real reaper process expiring a task no worker took.

A queued task with a deadline ends "expired" once its deadline passed, or once now + est_s
(+ the model's mean catalog load time while no live worker holds it) is past the deadline.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest
from helpers import T0, ack, claim, enqueue, fail, heartbeat, raw_enqueue_call, reap
from procs import Procs, wait_for

from gpuq import Queue, catalog
from gpuq.errors import InvalidTask, TaskFailed
from gpuq.reaper import Reaper
from gpuq.task import State, TaskRecord, ended_count
from gpuq.work_index import member

LEASE_MS = 30_000  # Config.lease_s default
MakeQueue = Callable[..., Queue]


def expire(queue: Queue, now_ms: int, limit: int = 100, horizon_ms: int = 0) -> tuple[int, int]:
    """One expiry pass at a virtual time: (expired, looked at)."""
    expired, looked, _ = queue.scripts.run(queue.calls.expire(limit=limit, horizon_ms=horizon_ms,
                                                              now_ms=now_ms))
    return expired, looked


def kept(queue: Queue, tid: str, now_ms: int, horizon_ms: int = 0, looked: int = 1) -> None:
    """An expiry pass at ``now_ms`` leaves ``tid`` queued (having looked at ``looked`` tasks)."""
    assert expire(queue, now_ms, horizon_ms=horizon_ms) == (0, looked)
    assert queue.record(tid).state is State.QUEUED


def expires(queue: Queue, tid: str, now_ms: int, horizon_ms: int = 0) -> TaskRecord:
    """An expiry pass at ``now_ms`` expires ``tid``, the one task it looks at; its record."""
    assert expire(queue, now_ms, horizon_ms=horizon_ms) == (1, 1)
    r = queue.record(tid)
    assert r.state is State.EXPIRED
    return r


def measured_loads(queue: Queue, model: str, *seconds: float) -> None:
    """Model loads as workers record them in the catalog (its mean feeds the expiry)."""
    pipe = queue.redis.pipeline(transaction=False)
    for s in seconds:
        catalog.record_load(pipe, queue.keys, model, 1, s)
    pipe.execute()


def assert_unqueued(queue: Queue, tid: str, priority: int = 2, model: str = "A") -> None:
    k = queue.keys
    assert queue.redis.zscore(k.queue(priority, model), tid) is None
    assert queue.redis.zscore(k.need, tid) is None
    assert queue.redis.zscore(k.deadlines, tid) is None


# --- contract: fakeredis and real Redis -------------------------------------------------

def test_a_deadline_passed_while_queued_expires_the_task_and_wakes_its_waiters(
        queue: Queue) -> None:
    tid = enqueue(queue, T0, deadline_s=10, est_s=0)
    assert queue.redis.zscore(queue.keys.deadlines, tid) == T0 + 10_000
    kept(queue, tid, T0 + 9_999, looked=0)  # not due: not even looked at

    r = expires(queue, tid, T0 + 10_000)
    assert r.error == "deadline passed while queued"
    assert r.finished_at == (T0 + 10_000) / 1000 and r.deadline == (T0 + 10_000) / 1000
    assert r.attempt == 0 and r.worker is None
    assert_unqueued(queue, tid)
    assert queue.redis.zscore(queue.keys.models_with_work, member(2, "A")) is None
    assert queue.redis.pttl(queue.keys.task(tid)) > 0  # ended tasks keep the result TTL

    # waiters see the end: result() raises naming the state, wait() returns the record
    with pytest.raises(TaskFailed) as err:
        queue.task(tid).result(timeout=1)
    assert (err.value.state, err.value.error) == ("expired", "deadline passed while queued")
    assert "expired" in str(err.value)
    assert queue.wait(tid, timeout=1).state is State.EXPIRED

    # gone for good: no claim returns it, a second pass does nothing
    assert claim(queue, "w1", 40, now_ms=T0 + 10_001) is None
    assert expire(queue, T0 + 60_000) == (0, 0)
    assert queue.record(tid).state is State.EXPIRED


def test_a_deadline_the_estimate_cannot_meet_expires_before_it_passes(queue: Queue) -> None:
    tid = enqueue(queue, T0, deadline_s=10, est_s=4)
    assert queue.redis.zscore(queue.keys.deadlines, tid) == T0 + 6_000  # latest start
    kept(queue, tid, T0 + 6_000)  # now + 4 s ends right at the deadline: fine

    r = expires(queue, tid, T0 + 6_001)
    assert r.error == "deadline cannot be met: 3.999 s left, task needs 4.000 s"
    assert r.finished_at == (T0 + 6_001) / 1000
    assert_unqueued(queue, tid)
    assert claim(queue, "w1", 40, now_ms=T0 + 6_002) is None


def test_a_deadline_shorter_than_the_tasks_own_estimate_is_refused_at_enqueue(queue: Queue) -> None:
    """Regression: est_s 30 with deadline_s 5 was queued, handed over to an idle worker at
    once, and ran 25 s past its deadline (counted a late start): the expiry that would refuse
    it runs once a round. A producer's own estimate that cannot meet its deadline is bad
    input; a learned estimate is the pool's guess, and the expiry judges it."""
    with pytest.raises(InvalidTask, match="deadline_s 5 is shorter than est_s 30: it cannot end in time"):
        enqueue(queue, T0, est_s=30, deadline_s=5)  # the client's check
    _, call = raw_enqueue_call(queue, T0, est_s="30", deadline="5000")  # another client's call
    with pytest.raises(InvalidTask, match="deadline is shorter than est_s: the task could not end in time"):
        queue.scripts.run(call)
    assert queue.redis.zcard(queue.keys.queue(2, "A")) == 0  # nothing written
    # no estimate given, none learned: the 1 s taken is a guess too (a handler author's
    # first online task, deadline 0.5 s, was refused as "shorter than est_s")
    first = enqueue(queue, T0, deadline_s=0.5)
    assert queue.record(first).state is State.QUEUED
    assert expires(queue, first, T0 + 1).error == "deadline cannot be met: 0.499 s left, task needs 1.000 s"
    queue.redis.hset(queue.keys.runtimes, "h A", "30 40 3")  # learned: a mean of 30 s
    guessed = enqueue(queue, T0, deadline_s=5)  # taken; expired once it cannot meet it
    assert queue.record(guessed).state is State.QUEUED
    expired = expires(queue, guessed, T0 + 1)
    assert expired.error == "deadline cannot be met: 4.999 s left, task needs 30.000 s"
    exact = enqueue(queue, T0, est_s=5, deadline_s=5)  # ends right at its deadline: taken
    assert queue.record(exact).state is State.QUEUED


def test_a_cold_model_load_alone_makes_the_deadline_unmeetable(queue: Queue) -> None:
    measured_loads(queue, "A", 2.0, 4.0)  # mean load 3 s; no worker holds A
    tid = enqueue(queue, T0, deadline_s=10, est_s=4)
    # without looking ahead for loads the task is not due yet (latest start T0 + 6 s)
    assert expire(queue, T0 + 3_001, horizon_ms=0) == (0, 0)
    # T0 + 3 s + 4 s run + 3 s load ends right at the deadline
    kept(queue, tid, T0 + 3_000, horizon_ms=3_000)

    r = expires(queue, tid, T0 + 3_001, horizon_ms=3_000)
    assert r.error == ("deadline cannot be met: 6.999 s left, task needs 4.000 s plus 3.000 s "
                       "to load model A (no live worker holds it)")
    assert_unqueued(queue, tid)
    assert queue.redis.hget(queue.keys.stats, "expired:P2") == "1"


def test_a_live_holder_of_the_model_keeps_the_task_but_a_dead_one_does_not(
        queue: Queue) -> None:
    measured_loads(queue, "A", 3.0)
    tid = enqueue(queue, T0, deadline_s=40, est_s=4)  # latest start T0 + 36 s; cold: T0 + 33 s
    # w1 holds A and is live until T0 + 35 s (one heartbeat at T0 + 5 s)
    assert heartbeat(queue, "w1", [], now_ms=T0 + 5_000) == []
    queue.redis.sadd(queue.keys.holders("A"), "w1")
    assert expire(queue, T0 + 33_001, horizon_ms=3_000) == (0, 1)
    kept(queue, tid, T0 + 35_000, horizon_ms=3_000)

    # w1's liveness lapsed (not reaped yet: it is still listed as a holder)
    r = expires(queue, tid, T0 + 35_001, horizon_ms=3_000)
    assert r.error is not None and "plus 3.000 s to load model A (no live worker holds it)" in r.error


def test_a_model_never_loaded_adds_no_load_time(queue: Queue) -> None:
    """No catalog entry: nothing is known about the load, so only the estimate counts."""
    tid = enqueue(queue, T0, model="fresh", deadline_s=10, est_s=4)
    kept(queue, tid, T0 + 6_000, horizon_ms=600_000)
    expires(queue, tid, T0 + 6_001, horizon_ms=600_000)


def test_a_task_without_a_deadline_never_expires(queue: Queue) -> None:
    measured_loads(queue, "A", 100.0)
    tid = enqueue(queue, T0, est_s=50)
    assert queue.redis.zcard(queue.keys.deadlines) == 0
    ten_years = 10 * 365 * 86_400_000
    assert expire(queue, T0 + ten_years, horizon_ms=600_000) == (0, 0)
    assert queue.record(tid).state is State.QUEUED
    c = claim(queue, "w1", 40, now_ms=T0 + ten_years)
    assert c is not None and c["id"] == tid


def test_claimed_tasks_are_not_expired_and_a_retry_is_watched_again(
        make_queue: MakeQueue) -> None:
    q = make_queue(retry_base_s=1.0)
    tid = enqueue(q, T0, deadline_s=10, est_s=1, max_attempts=3)
    c = claim(q, "w1", 40, now_ms=T0 + 1)
    assert c is not None and c["id"] == tid and c["deadline"] == str(T0 + 10_000)
    assert q.redis.zscore(q.keys.deadlines, tid) is None  # running: not watched

    assert expire(q, T0 + 20_000) == (0, 0)
    r = q.record(tid)
    assert r.state is State.RUNNING and r.error is None

    # the attempt fails past the deadline; waiting out its backoff it is not expired either
    assert fail(q, tid, c["token"], "oom", now_ms=T0 + 20_001) == "delayed"
    assert expire(q, T0 + 20_500) == (0, 0)
    assert q.record(tid).state is State.DELAYED
    # due past its deadline, it ends expired rather than going back to its queue
    assert reap(q, now_ms=T0 + 21_001).promoted == 1
    r = q.record(tid)
    assert r.state is State.EXPIRED and r.error == "deadline passed while delayed"
    assert r.attempt == 1  # the failed attempt still counts
    assert_unqueued(q, tid)


def test_a_due_retry_that_can_still_make_its_deadline_is_queued_and_watched(
        make_queue: MakeQueue) -> None:
    q = make_queue(retry_base_s=1.0)
    tid = enqueue(q, T0, deadline_s=30, est_s=1, max_attempts=3)
    c = claim(q, "w1", 40, now_ms=T0 + 1)
    assert c is not None
    assert fail(q, tid, c["token"], "oom", now_ms=T0 + 2_000) == "delayed"
    assert reap(q, now_ms=T0 + 10_000).promoted == 1
    assert q.record(tid).state is State.QUEUED
    assert q.redis.zscore(q.keys.deadlines, tid) == T0 + 29_000
    r = expires(q, tid, T0 + 29_500)
    assert r.error is not None and r.error.startswith("deadline cannot be met")


def test_a_claim_does_not_start_a_due_retry_past_its_deadline(make_queue: MakeQueue) -> None:
    """Regression: a claim promotes due retries and took one in the same call, so a retry
    whose deadline had passed while it waited out its backoff ran anyway (seen: attempts
    started 13 s past a 6 s deadline, the task ending failed, not expired)."""
    q = make_queue(retry_base_s=1.0)
    tid = enqueue(q, T0, deadline_s=5, est_s=2, max_attempts=3)
    c = claim(q, "w1", 40, now_ms=T0 + 1)
    assert c is not None
    assert fail(q, tid, c["token"], "oom", now_ms=T0 + 3_500) == "delayed"
    assert claim(q, "w1", 40, now_ms=T0 + 6_000) is None  # due, its deadline passed
    r = q.record(tid)
    assert r.state is State.EXPIRED and r.error == "deadline passed while delayed"
    assert r.attempt == 1
    assert_unqueued(q, tid)


def test_a_lost_lease_past_the_deadline_expires_instead_of_being_requeued(queue: Queue) -> None:
    """Regression: the lost lease's task went back to its queue and the worker its push woke
    claimed it before the reaper's expiry pass: a task that could no longer end in time ran
    again (seen: started 0.2 s before a 3 s task's deadline, ended 2.8 s past it)."""
    tid = enqueue(queue, T0, deadline_s=10, est_s=1)
    c = claim(queue, "w1", 40, now_ms=T0)
    assert c is not None
    r = reap(queue, now_ms=T0 + LEASE_MS + 1)
    assert (r.requeued, r.failed) == (0, 0)
    rec = queue.record(tid)
    assert rec.state is State.EXPIRED and rec.error == "deadline passed while it ran"
    assert claim(queue, "w2", 40, now_ms=T0 + LEASE_MS + 2) is None
    assert_unqueued(queue, tid)


def test_a_requeue_that_can_still_make_the_deadline_queues_the_task(queue: Queue) -> None:
    tid = enqueue(queue, T0, deadline_s=60, est_s=1)
    c = claim(queue, "w1", 40, now_ms=T0)
    assert c is not None
    assert reap(queue, now_ms=T0 + LEASE_MS + 1).requeued == 1
    assert queue.record(tid).state is State.QUEUED
    assert queue.redis.zscore(queue.keys.deadlines, tid) == T0 + 59_000


def test_stats_count_expired_tasks_per_priority(queue: Queue) -> None:
    ids = [enqueue(queue, T0, priority=p, deadline_s=1, est_s=0) for p in ("P0", "P3", "P3")]
    kept = enqueue(queue, T0, priority="P1", deadline_s=100, est_s=0)
    assert expire(queue, T0 + 5_000) == (3, 3)
    assert [queue.record(t).state for t in ids] == [State.EXPIRED] * 3
    assert queue.record(kept).state is State.QUEUED
    stats = queue.redis.hgetall(queue.keys.stats)
    assert stats["expired:P0"] == "1" and stats["expired:P3"] == "2"
    assert "expired:P1" not in stats and "expired:P2" not in stats
    assert "expired" not in stats and ended_count(stats, "expired") == 3  # one count a task


def test_a_task_that_expires_unstarted_counts_its_sla_missed(queue: Queue) -> None:
    """Found by an online service's owner: a P0 task that expired queued never had its SLA
    decided (decided at a handler's start), so `gpuq status`, `top` and the exporter showed
    100% (or nothing) for a pool letting every late online task expire. One that expires
    without ever starting missed it (its latest start is past its start-by time), for its
    tenant too; one whose SLA was decided at an earlier start is not counted again."""
    from gpuq.tenants import Tenant, set_tenant

    set_tenant(queue, Tenant("shop"))
    never = enqueue(queue, T0, priority="P0", deadline_s=1, est_s=0, tenant="shop")
    started = enqueue(queue, T0, priority="P0", deadline_s=31, est_s=1, model="B")
    c = claim(queue, "w1", 40, loaded=[("B", 0)], now_ms=T0)
    assert c is not None and c["id"] == started and c["sla"] == "met"
    assert expire(queue, T0 + 5_000) == (1, 1)
    reap(queue, now_ms=T0 + LEASE_MS + 1)  # its lease lost past the deadline: expired
    assert queue.record(started).state is State.EXPIRED
    stats = queue.redis.hgetall(queue.keys.stats)
    assert (stats["sla_met:P0"], stats["sla_missed:P0"], stats["sla_missed:P0:shop"]) == ("1", "1", "1")
    kinds = [json.loads(m)["kind"] for m in queue.redis.lrange(queue.keys.sla_misses, 0, -1)]
    assert kinds == ["expired", "expired"]
    # found by a review: an operator's requeue of the unstarted one, then its start (with
    # the score it kept), counted its miss twice; the expiry's count is taken back
    assert queue.requeue(never) is State.QUEUED
    assert queue.redis.hget(queue.keys.stats, "sla_missed:P0") == "0"
    c = claim(queue, "w1", 40, loaded=[("A", 0)], now_ms=T0 + 6_000)
    assert c is not None and c["id"] == never and c["sla"] == "missed"
    stats = queue.redis.hgetall(queue.keys.stats)
    assert (stats["sla_missed:P0"], stats["sla_missed:P0:shop"]) == ("1", "1")


def test_expire_is_bounded_earliest_latest_start_first(queue: Queue) -> None:
    # latest starts (deadline - estimate) T0 + 1 s .. T0 + 5 s, enqueued in another order
    order = [3, 1, 5, 2, 4]
    ids = {n: enqueue(queue, T0, deadline_s=n + 1, est_s=1) for n in order}
    free = enqueue(queue, T0, model="B")  # no deadline
    now = T0 + 60_000
    assert expire(queue, now, limit=2) == (2, 2)
    assert {n for n, t in ids.items() if queue.record(t).state is State.EXPIRED} == {1, 2}
    assert expire(queue, now, limit=2) == (2, 2)
    assert expire(queue, now, limit=2) == (1, 1)
    assert expire(queue, now, limit=2) == (0, 0)
    assert all(queue.record(t).state is State.EXPIRED for t in ids.values())
    assert queue.redis.zcard(queue.keys.deadlines) == 0
    # a claim finds only the task without a deadline
    c = claim(queue, "w1", 40, now_ms=now)
    assert c is not None and c["id"] == free
    assert claim(queue, "w2", 40, now_ms=now) is None


def test_an_expiry_pass_skips_what_is_not_due_and_keeps_the_rest_watched(queue: Queue) -> None:
    due = enqueue(queue, T0, deadline_s=1, est_s=0)
    later_ = enqueue(queue, T0, deadline_s=30, est_s=1)
    assert expire(queue, T0 + 2_000) == (1, 1)
    assert queue.record(due).state is State.EXPIRED
    assert queue.record(later_).state is State.QUEUED
    assert queue.redis.zscore(queue.keys.deadlines, later_) == T0 + 29_000
    c = claim(queue, "w1", 40, now_ms=T0 + 2_001)
    assert c is not None and c["id"] == later_
    ack(queue, later_, c["token"], "ok", now_ms=T0 + 3_000)
    assert expire(queue, T0 + 60_000) == (0, 0)
    assert queue.record(later_).state is State.SUCCEEDED


def test_the_reaper_looks_ahead_by_the_longest_mean_load(queue: Queue) -> None:
    """Reaper.expire (server clock) takes its horizon from the catalog: a task whose latest
    start is 6 s away still expires now when its model's 30 s load cannot fit."""
    reaper = Reaper(queue.redis, queue.config)
    warm = enqueue(queue, model="held", deadline_s=10, est_s=4)
    assert reaper.expire() == 0  # nothing measured: no look-ahead, nothing due
    measured_loads(queue, "A", 30.0)
    measured_loads(queue, "held", 30.0)
    assert heartbeat(queue, "w1", []) == []  # live by the server clock
    queue.redis.sadd(queue.keys.holders("held"), "w1")
    cold = enqueue(queue, model="A", deadline_s=10, est_s=4)
    assert reaper.expire() == 1
    r = queue.record(cold)
    assert r.state is State.EXPIRED
    assert r.error is not None and "to load model A (no live worker holds it)" in r.error
    assert queue.record(warm).state is State.QUEUED  # w1 holds its model


def test_the_reaper_expires_a_long_backlog_in_one_round(queue: Queue) -> None:
    measured_loads(queue, "A", 30.0)  # no live worker holds A: each needs a 30 s load first
    ids = [t.id for t in queue.enqueue_many(
        {"handler": "h", "model": "A", "vram_gb": 1, "est_s": 5, "deadline_s": 10}
        for _ in range(250))]
    assert Reaper(queue.redis, queue.config).expire() == 250
    assert all(queue.record(t).state is State.EXPIRED for t in ids)
    assert queue.redis.hget(queue.keys.stats, "expired:P2") == "250"


def test_tasks_that_can_still_start_in_time_do_not_hide_one_that_cannot(queue: Queue) -> None:
    """A full page of queued tasks inside the look-ahead that can still meet their deadlines
    (their model is held by a live worker) must not keep the reaper from expiring a later
    task whose cold load cannot fit."""
    measured_loads(queue, "warm", 30.0)
    measured_loads(queue, "cold", 30.0)  # look-ahead: 30 s
    assert heartbeat(queue, "w1", []) == []
    queue.redis.sadd(queue.keys.holders("warm"), "w1")
    warm = queue.enqueue_many({"handler": "h", "model": "warm", "vram_gb": 1, "est_s": 4,
                               "deadline_s": 10} for _ in range(100))  # latest start: now + 6 s
    cold = enqueue(queue, model="cold", deadline_s=20, est_s=4)  # needs 34 s of its 20
    assert Reaper(queue.redis, queue.config).expire() == 1
    assert queue.record(cold).state is State.EXPIRED
    assert all(queue.record(t.id).state is State.QUEUED for t in warm)


def test_entries_that_left_the_window_do_not_move_the_next_page_past_unseen_tasks(
        queue: Queue) -> None:
    """A page's entries that leave the window (a task whose hash is gone) are not kept in
    front of it: the next page starts after the kept ones only, so a task that cannot meet
    its deadline behind them is still seen in the same round."""
    measured_loads(queue, "warm", 30.0)
    measured_loads(queue, "cold", 30.0)  # look-ahead: 30 s
    assert heartbeat(queue, "w1", []) == []
    queue.redis.sadd(queue.keys.holders("warm"), "w1")
    seconds, micros = queue.redis.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    queue.redis.zadd(queue.keys.deadlines, {f"gone{i:02}": now - 1000 for i in range(50)})

    def warm(deadline_s: float, n: int) -> None:
        queue.enqueue_many({"handler": "h", "model": "warm", "vram_gb": 1, "est_s": 4,
                            "deadline_s": deadline_s} for _ in range(n))
    warm(10, 50)  # latest start: now + 6 s
    cold = enqueue(queue, model="cold", deadline_s=20, est_s=4)  # needs 34 s of its 20
    warm(29, 100)  # latest start: now + 25 s
    # 50 gone + 50 kept, then 100 from the 51st kept: the cold one among them
    assert Reaper(queue.redis, queue.config).expire() == 1
    assert queue.record(cold).state is State.EXPIRED
    assert queue.redis.zcard(queue.keys.deadlines) == 150


def test_a_blocked_waiter_wakes_when_its_task_expires(real_queue: Queue) -> None:
    tid = enqueue(real_queue, T0, deadline_s=5, est_s=0)
    outcomes: list[tuple[str, str]] = []
    records: list[State] = []

    def wait_result() -> None:
        try:
            real_queue.task(tid).result(timeout=10)
        except TaskFailed as exc:
            outcomes.append((exc.state, exc.error))

    def wait_record() -> None:
        records.append(real_queue.wait(tid, timeout=10).state)

    waiters = [threading.Thread(target=f, daemon=True) for f in (wait_result, wait_record)]
    for w in waiters:
        w.start()
    time.sleep(0.2)  # both block on the done list
    start = time.monotonic()
    assert expire(real_queue, T0 + 6_000) == (1, 1)
    for w in waiters:
        w.join(5)
    assert time.monotonic() - start < 3
    assert outcomes == [("expired", "deadline passed while queued")]
    assert records == [State.EXPIRED]


# --- a real reaper process ---------------------------------------------------------------

def test_a_reaper_process_expires_tasks_no_worker_took(procs: Procs, real_queue: Queue) -> None:
    procs.reaper()
    measured_loads(real_queue, "big", 40.0)  # no live worker holds it: 20 s of work, a 40 s load
    hopeless = real_queue.enqueue("sim.run", model="big", vram_gb=4, est_s=20, deadline_s=30)
    start = time.monotonic()
    late = real_queue.enqueue("sim.run", model="m", vram_gb=4, est_s=0, deadline_s=1.5,
                              priority="P1")
    with pytest.raises(TaskFailed) as err:
        late.result(timeout=15)
    waited = time.monotonic() - start
    assert err.value.state == "expired"
    assert err.value.error == "deadline passed while queued"
    assert 1.4 <= waited < 10

    out = procs.cli("task", late.id, "--json")
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["state"] == "expired" and shown["error"] == "deadline passed while queued"
    assert shown["priority"] == "P1"
    assert shown["finished_at"] >= shown["deadline"]

    r = procs.wait_state(hopeless.id, State.EXPIRED, timeout=5)
    assert r.error is not None and r.error.startswith("deadline cannot be met: ")
    assert r.error.endswith(" s left, task needs 20.000 s plus 40.000 s to load model big "
                            "(no live worker holds it)")
    stats = procs.redis.hgetall(real_queue.keys.stats)
    assert stats["expired:P1"] == "1" and stats["expired:P2"] == "1"
    wait_for(lambda: procs.redis.zcard(real_queue.keys.deadlines) == 0, timeout=5,
             message="the deadlines index to empty")
