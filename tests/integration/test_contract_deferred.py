"""Contract suite: delayed tasks and dependencies (enqueue's due and after fields).

A delayed task waits in the delayed set (state delayed) until its due time by the scripts'
clock, then is queued by the next claim or reaper pass, its SLA and deadline counted from
then. A task enqueued ``after`` others waits (state waiting) until they end: released when
every one succeeded (or ended at all, with after_any_outcome), canceled with the parent's
name otherwise, in the script that ends the parent. Each test runs on fakeredis and on the
real server (``backend``), under a virtual clock.
"""

from __future__ import annotations

import json

import pytest
from helpers import T0, ack, claim, enqueue, enqueue_specs, fail, pool_keys, reap, spec

from gpuq import Queue
from gpuq.errors import DuplicateTask, InvalidTask
from gpuq.task import State

SLA_P0 = 200


def state(q: Queue, tid: str) -> str:
    return str(q.redis.hget(q.keys.task(tid), "state"))


def field(q: Queue, tid: str, name: str) -> str | None:
    value = q.redis.hget(q.keys.task(tid), name)
    return None if value is None else str(value)


def run(q: Queue, tid: str, now_ms: int, worker: str = "w1") -> dict[str, str]:
    """Claim the task (it must be the one claimed) as a worker holding model A."""
    c = claim(q, worker, 20, loaded=[("A", 1)], now_ms=now_ms)
    assert c is not None and c["id"] == tid, c
    return c


# ---- delayed tasks ------------------------------------------------------------------------

def test_a_delayed_task_is_claimable_at_its_due_time_and_not_before(queue: Queue) -> None:
    tid = enqueue(queue, T0, priority="P0", delay_s=5)
    assert state(queue, tid) == "delayed" and field(queue, tid, "due_at") == str(T0 + 5000)
    assert queue.redis.zscore(queue.keys.delayed, tid) == T0 + 5000
    assert claim(queue, "w1", 20, loaded=[("A", 1)], now_ms=T0 + 4999) is None
    c = run(queue, tid, T0 + 5000 + 150)
    assert c["sla"] == "met"  # its SLA counts from the due time, not from enqueue
    assert c["due_at"] == str(T0 + 5000)  # the worker's latency histogram counts from it too
    assert field(queue, tid, "queued_at") == str(T0 + 5000)  # queued since it was due
    assert queue.record(tid).due_at == (T0 + 5000) / 1000


def test_a_delayed_tasks_queue_phase_counts_from_its_due_time_not_its_promotion(queue: Queue) -> None:
    """The worker's queue phase is started_at - queued_at: a reaper round (or claim) that
    promotes a task after its due time must not hide that lag from the phase split."""
    late = enqueue(queue, T0, priority="P1", delay_s=5)
    assert reap(queue, T0 + 5400).promoted == 1  # a round 400 ms after the due time
    c = run(queue, late, T0 + 5600)
    assert (c["queued_at"], c["started_at"], c["due_at"]) == (str(T0 + 5000), str(T0 + 5600), str(T0 + 5000))
    # the claim that promotes one does the same; a retry is queued from its backoff's end
    tid = enqueue(queue, T0, priority="P1", delay_s=1)
    c = run(queue, tid, T0 + 1300)
    assert c["queued_at"] == str(T0 + 1000)
    assert fail(queue, tid, c["token"], now_ms=T0 + 2000) == "delayed"
    due = int(queue.redis.zscore(queue.keys.delayed, tid))
    assert run(queue, tid, due + 700)["queued_at"] == str(due)


def test_a_delayed_task_misses_its_sla_counted_from_its_due_time(queue: Queue) -> None:
    tid = enqueue(queue, T0, priority="P0", delay_s=5)
    assert field(queue, tid, "score") == str(T0 + 5000 + SLA_P0)
    assert reap(queue, T0 + 5000).promoted == 1
    assert state(queue, tid) == "queued"
    assert run(queue, tid, T0 + 5000 + SLA_P0 + 1)["sla"] == "missed"
    (miss,) = [json.loads(m) for m in queue.redis.lrange(queue.keys.sla_misses, 0, -1)]
    assert miss["wait_s"] == (SLA_P0 + 1) / 1000  # since it was due, not since its enqueue


def test_at_names_an_epoch_time_and_the_past_is_refused(queue: Queue) -> None:
    tid = enqueue(queue, T0, at=(T0 + 3000) / 1000)
    assert queue.redis.zscore(queue.keys.delayed, tid) == T0 + 3000
    before = pool_keys(queue)
    with pytest.raises(InvalidTask, match="at is in the past"):
        enqueue(queue, T0, at=(T0 - 1000) / 1000)
    assert pool_keys(queue) == before


@pytest.mark.parametrize("options, fragment", [
    ({"delay_s": 1, "at": 2e9}, "not both"),
    ({"delay_s": -1}, "delay_s must be a finite number >= 0"),
    ({"at": float("nan")}, "at must be a finite number"),
    ({"delay_s": 1, "after": ["x"]}, "after cannot be combined"),
])
def test_bad_deferrals_are_refused_before_anything_is_sent(queue: Queue, options: dict[str, object],
                                                         fragment: str) -> None:
    with pytest.raises(InvalidTask, match=fragment):
        enqueue(queue, T0, **options)
    assert pool_keys(queue) == set()


def test_a_zero_delay_is_queued_at_once(queue: Queue) -> None:
    tid = enqueue(queue, T0, delay_s=0)
    assert state(queue, tid) == "queued"


def test_a_delayed_task_deadline_counts_from_its_due_time(queue: Queue) -> None:
    tid = enqueue(queue, T0, priority="P2", delay_s=60, deadline_s=10, est_s=1)
    assert field(queue, tid, "deadline") == str(T0 + 70_000)
    assert field(queue, tid, "score") == str(T0 + 69_000)  # deadline - estimate < due + 5 min


def test_a_delayed_task_can_be_canceled_and_is_never_promoted(queue: Queue) -> None:
    tid = enqueue(queue, T0, delay_s=5)
    assert queue.cancel(tid) is State.DELAYED
    assert reap(queue, T0 + 6000).promoted == 0
    assert state(queue, tid) == "canceled"


def test_a_bulk_call_mixes_delayed_and_queued_tasks(queue: Queue) -> None:
    now_spec, later = spec(), spec(delay_s=2)
    assert enqueue_specs(queue, [now_spec, later], T0) == 2
    assert state(queue, now_spec.task_id) == "queued" and state(queue, later.task_id) == "delayed"


# ---- dependencies -------------------------------------------------------------------------

def test_a_chain_releases_each_child_when_its_parent_succeeds(queue: Queue) -> None:
    a = enqueue(queue, T0, priority="P0")
    b = enqueue(queue, T0, priority="P0", after=[a])
    c = enqueue(queue, T0, priority="P0", after=[b])
    assert (state(queue, b), state(queue, c)) == ("waiting", "waiting")
    assert queue.redis.zcard(queue.keys.waiting) == 2
    ta = run(queue, a, T0 + 10)
    assert claim(queue, "w2", 20, now_ms=T0 + 20) is None  # b waits
    ack(queue, a, ta["token"], now_ms=T0 + 1000)
    assert state(queue, b) == "delayed" and field(queue, b, "score") == str(T0 + 1000 + SLA_P0)
    tb = run(queue, b, T0 + 1100)
    assert tb["sla"] == "met"  # counted from its release, not its enqueue
    ack(queue, b, tb["token"], now_ms=T0 + 2000)
    run(queue, c, T0 + 2000)
    assert queue.redis.zcard(queue.keys.waiting) == 0
    assert queue.record(c).parents == [b]
    assert queue.redis.smembers(queue.keys.children(a)) == {b}


def test_a_release_wakes_an_idle_worker(queue: Queue) -> None:
    a = enqueue(queue, T0)
    b = enqueue(queue, T0, after=[a])
    ta = run(queue, a, T0)
    queue.redis.delete(queue.keys.pool_wake)
    ack(queue, a, ta["token"], now_ms=T0 + 10)
    assert queue.redis.llen(queue.keys.pool_wake) == 1
    assert b


def test_a_failed_parent_cancels_its_children_and_theirs_in_turn(queue: Queue) -> None:
    a = enqueue(queue, T0, max_attempts=1)
    b = enqueue(queue, T0, after=[a])
    c = enqueue(queue, T0, after=[b])
    ta = run(queue, a, T0)
    assert fail(queue, a, ta["token"], now_ms=T0 + 10) == "failed"
    rb, rc = queue.record(b), queue.record(c)
    assert (rb.state, rb.error) == (State.CANCELED, f"parent task {a} ended failed")
    assert (rc.state, rc.error) == (State.CANCELED, f"parent task {b} ended canceled")
    assert queue.redis.zcard(queue.keys.waiting) == 0


def test_a_retried_parent_does_not_release_its_children(queue: Queue) -> None:
    a = enqueue(queue, T0, max_attempts=2)
    b = enqueue(queue, T0, after=[a])
    ta = run(queue, a, T0)
    assert fail(queue, a, ta["token"], now_ms=T0 + 10) == "delayed"
    assert state(queue, b) == "waiting"


def test_after_any_outcome_releases_once_every_parent_ended(queue: Queue) -> None:
    a, b = enqueue(queue, T0, max_attempts=1), enqueue(queue, T0)
    c = enqueue(queue, T0, after=[a, b], after_any_outcome=True)
    assert field(queue, c, "pending") == "2"
    ta = run(queue, a, T0)
    fail(queue, a, ta["token"], retry=False, now_ms=T0 + 10)
    assert state(queue, c) == "waiting" and field(queue, c, "pending") == "1"
    queue.cancel(b)
    assert state(queue, c) == "delayed"


def test_an_expired_parent_cancels_its_child(queue: Queue) -> None:
    a = enqueue(queue, T0, deadline_s=1, est_s=0.5)
    b = enqueue(queue, T0, after=[a])
    queue.scripts.run(queue.calls.expire(now_ms=T0 + 2000))
    assert state(queue, a) == "expired"
    assert (state(queue, b), field(queue, b, "error")) == ("canceled", f"parent task {a} ended expired")


def test_canceling_a_waiting_child_makes_the_release_skip_it(queue: Queue) -> None:
    a = enqueue(queue, T0)
    b = enqueue(queue, T0, after=[a])
    assert queue.cancel(b) is State.WAITING
    ta = run(queue, a, T0)
    ack(queue, a, ta["token"], now_ms=T0 + 10)
    assert state(queue, b) == "canceled" and reap(queue, T0 + 20).promoted == 0


def test_a_child_canceled_while_waiting_runs_when_an_operator_requeues_it(queue: Queue) -> None:
    """Regression: the requeue answered queued, then push found no start-by score (a waiting
    child gets one only at its release) and failed the task as corrupt."""
    a = enqueue(queue, T0)
    b = enqueue(queue, T0, after=[a], priority="P1")
    assert queue.cancel(b) is State.WAITING
    assert queue.requeue(b) is State.QUEUED
    c = claim(queue, "w1", 20)
    assert c is not None and c["id"] == b  # P1 first: its parent is not waited for again


def test_a_child_of_parents_that_already_succeeded_is_queued_at_once(queue: Queue) -> None:
    a = enqueue(queue, T0)
    ack(queue, a, run(queue, a, T0)["token"], now_ms=T0 + 10)
    b = enqueue(queue, T0 + 20, after=[a])
    assert state(queue, b) == "queued" and field(queue, b, "parents") == a


def test_unknown_parents_self_and_ended_parents_are_refused(queue: Queue) -> None:
    with pytest.raises(InvalidTask, match="unknown parent task nope"):
        enqueue(queue, T0, after=["nope"])
    with pytest.raises(InvalidTask, match="cannot wait for itself"):
        enqueue(queue, T0, task_id="me", after=["me"])
    a = enqueue(queue, T0)
    queue.cancel(a)
    before = pool_keys(queue)
    with pytest.raises(InvalidTask, match=f"parent task {a} ended canceled"):
        enqueue(queue, T0, after=[a])
    assert pool_keys(queue) == before
    assert state(queue, enqueue(queue, T0, after=[a], after_any_outcome=True)) == "queued"


def test_no_cycle_can_form_even_with_given_ids(queue: Queue) -> None:
    """A parent must be stored (or earlier in the call) and the new id must not be: a task
    could only close a cycle by naming one that does not exist yet, or itself."""
    with pytest.raises(InvalidTask, match="unknown parent task b"):
        enqueue(queue, T0, task_id="a", after=["b"])
    a = enqueue(queue, T0, task_id="a")
    enqueue(queue, T0, task_id="b", after=[a])
    with pytest.raises(DuplicateTask):  # a again, after b
        enqueue(queue, T0, task_id="a", after=["b"])
    later, first = spec(task_id="c", after=["d"]), spec(task_id="d", after=["c"])
    with pytest.raises(InvalidTask, match="unknown parent task d"):  # a later one of the call
        enqueue_specs(queue, [later, first], T0)
    assert state(queue, "b") == "waiting" and queue.redis.exists(queue.keys.task("c")) == 0


def test_a_bulk_call_may_chain_its_own_tasks(queue: Queue) -> None:
    first = spec(priority="P1")
    second = spec(priority="P1", after=[first.task_id])
    enqueue_specs(queue, [first, second], T0)
    assert state(queue, second.task_id) == "waiting"
    ack(queue, first.task_id, run(queue, first.task_id, T0)["token"], now_ms=T0 + 5)
    run(queue, second.task_id, T0 + 6)


def test_a_child_keeps_its_deadline_from_enqueue(queue: Queue) -> None:
    a = enqueue(queue, T0)
    b = enqueue(queue, T0, after=[a], deadline_s=10, est_s=2)
    assert field(queue, b, "deadline") == str(T0 + 10_000)
    ack(queue, a, run(queue, a, T0)["token"], now_ms=T0 + 100)
    assert field(queue, b, "score") == str(T0 + 8000)  # deadline - estimate < release + 5 min
