"""Contract suite, part 3: tasks handed over at enqueue to an idle one-slot worker.

Each test runs on fakeredis and on the real server (the ``backend`` fixture). The worker
side (popping the hand-over off its wake list, which is its pickup) is tested with real
worker processes in test_worker.py and test_fault.py.
"""

from __future__ import annotations

import json

from helpers import T0, ack, claim, claim_reply, enqueue, heartbeat, reap

from gpuq import Queue, catalog, worker_record
from gpuq.task import State
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.presence import Presence

LEASE_MS, DEFER_MS, FAIR_EVERY = 30_000, 2_000, 5


def register(q: Queue, wid: str, *, slots: int = 1, handover: bool = True) -> None:
    """A worker as presence writes it, then idle: its claim found nothing."""
    gpu = GpuInfo("L4", f"uuid-{wid}", 24, None, "declared")
    fields = worker_record.identity(wid, gpu, 5.0, slots, "0123", "h", 1,
                               (DEFER_MS, FAIR_EVERY, LEASE_MS) if handover else None)
    Presence(q.redis, q.keys, wid).register(fields, LEASE_MS)
    assert claim(q, wid, 19, slots=slots, now_ms=T0) is None


def test_an_idle_one_slot_worker_is_handed_the_task_started(queue: Queue) -> None:
    register(queue, "w1")
    tid = enqueue(queue, T0 + 10, priority="P0", model="m", vram_gb=4, est_s=0.5)
    r = queue.record(tid)
    assert (r.state, r.worker, r.attempt) == (State.RUNNING, "w1", 1)
    assert queue.redis.zscore(queue.keys.idle, "w1") is None
    # the worker's lease; listed in `handed` until its pickup deadline: P0's defer bound,
    # min(2 s, SLA / 2)
    assert queue.redis.zscore(queue.keys.running, tid) == T0 + 10 + LEASE_MS
    assert queue.redis.zscore(queue.keys.handed, tid) == T0 + 10 + 100
    assert queue.redis.zcard(queue.keys.queue(0, "m")) == 0
    (message,) = queue.redis.lrange(queue.keys.wake("w1"), 0, -1)
    fields = json.loads(message)
    token = queue.redis.hget(queue.keys.task(tid), "token")
    assert fields["id"] == tid and fields["token"] == token and fields["attempt"] == "1"
    assert (fields["model"], fields["vram_gb"], fields["priority"], fields["est_s"]) == ("m", "4", "0", "0.5")
    # w1 holds no model: its handler starts after the load, which decides the SLA (began)
    assert fields["sla"] == "pending" and queue.redis.hget(queue.keys.stats, "sla_met:P0") is None


def pop_wake(q: Queue, wid: str) -> dict[str, str]:
    """What the worker's BLPOP does: take the hand-over off its wake list (the pickup)."""
    message = q.redis.rpop(q.keys.wake(wid))
    assert message is not None and message.startswith("{")
    return dict(json.loads(message))


def test_a_popped_hand_over_stays_handed_until_its_worker_takes_it_up(queue: Queue) -> None:
    register(queue, "w1")
    register(queue, "w2")
    tid = enqueue(queue, T0 + 10, model="m", vram_gb=4)
    worker = queue.record(tid).worker
    fields = pop_wake(queue, worker)
    other = "w2" if worker == "w1" else "w1"
    c = claim_reply(queue, other, 19, now_ms=T0 + 20)
    assert c.task is None and c.retry_s > 0  # popped, not yet taken up: look again then
    assert queue.redis.zscore(queue.keys.handed, tid) is not None
    # began (the handler starts) takes it up; its lease stays
    queue.scripts.run(queue.calls.began(tid, int(fields["token"]), now_ms=T0 + 30))
    assert queue.redis.zscore(queue.keys.handed, tid) is None
    assert queue.redis.zscore(queue.keys.running, tid) == T0 + 10 + LEASE_MS
    assert queue.record(tid).state is State.RUNNING


def test_a_hand_over_taken_up_runs_past_its_deadline(queue: Queue) -> None:
    """A long task: once taken up, no claim or reap takes it back."""
    register(queue, "w1")
    tid = enqueue(queue, T0 + 10, priority="P0", model="m", vram_gb=4)
    fields = pop_wake(queue, "w1")
    queue.scripts.run(queue.calls.began(tid, int(fields["token"]), now_ms=T0 + 20))
    assert reap(queue, now_ms=T0 + 5_000).requeued == 0
    assert claim(queue, "w2", 19, now_ms=T0 + 5_000) is None
    r = queue.record(tid)
    assert (r.state, r.worker) == (State.RUNNING, "w1")
    assert queue.redis.zscore(queue.keys.handed, tid) is None


def test_a_hand_over_popped_but_never_taken_up_is_taken_back_at_its_deadline(
        queue: Queue) -> None:
    """The server pops a hand-over for a worker frozen in its wait: its lease and liveness
    hold, but nothing takes the task up; at its pickup deadline it is taken back, its
    attempt given back, and the frozen worker's copy is fenced off."""
    register(queue, "w1")
    tid = enqueue(queue, T0 + 10, priority="P0", model="m", vram_gb=4)
    fields = pop_wake(queue, "w1")
    reap(queue, now_ms=T0 + 10 + 99)
    assert queue.record(tid).state is State.RUNNING  # its deadline is not past yet
    reap(queue, now_ms=T0 + 10 + 100)
    r = queue.record(tid)
    assert (r.state, r.attempt, r.worker) == (State.QUEUED, 0, None)
    assert r.error == "its worker did not take it up"
    assert queue.redis.zcard(queue.keys.handed) == 0
    assert tid in heartbeat(queue, "w1", [(tid, fields["token"])], now_ms=T0 + 200)


def test_an_ended_hand_over_leaves_handed_at_the_next_claim(queue: Queue) -> None:
    register(queue, "w1")
    tid = enqueue(queue, T0 + 10, model="m", vram_gb=4)
    fields = pop_wake(queue, "w1")
    ack(queue, tid, int(fields["token"]), now_ms=T0 + 20)
    assert queue.record(tid).state is State.SUCCEEDED
    c = claim_reply(queue, "w1", 19, now_ms=T0 + 30)
    assert c.task is None and c.retry_s == 0
    assert queue.redis.zcard(queue.keys.handed) == 0


def test_a_heartbeat_for_a_hand_over_leaves_handed(queue: Queue) -> None:
    register(queue, "w1")
    tid = enqueue(queue, T0 + 10, model="m", vram_gb=4)
    token = pop_wake(queue, "w1")["token"]
    assert heartbeat(queue, "w1", [(tid, token)], now_ms=T0 + 20) == []
    assert queue.redis.zscore(queue.keys.handed, tid) is None
    assert queue.redis.zscore(queue.keys.running, tid) == T0 + 20 + LEASE_MS


def test_enqueue_pushes_pool_wakes_only_while_a_worker_idles(queue: Queue) -> None:
    """Only idle workers block on the wake lists; a busy one claims again when it is done,
    so a token pushed while nobody idles would only wake a worker later, for nothing."""
    enqueue(queue, T0, model="m", vram_gb=30)  # no worker at all
    assert queue.redis.llen(queue.keys.pool_wake) == 0
    register(queue, "w1")  # idles with 19 GB: a 30 GB task is for nobody here
    enqueue(queue, T0 + 1, model="m", vram_gb=30)
    assert queue.redis.llen(queue.keys.pool_wake) == 1


def test_a_pickup_not_confirmed_in_time_goes_to_the_next_claim(queue: Queue) -> None:
    """The worker it was handed to died idle: another idle worker, woken by the pool-wide
    token, is told to look again at the pickup deadline, then takes the task."""
    register(queue, "dead")
    register(queue, "w2")
    queue.redis.zadd(queue.keys.idle, {"dead": 1})  # the tighter fit: it gets the task
    tid = enqueue(queue, T0 + 10, priority="P1", model="m", vram_gb=1)
    assert queue.record(tid).worker == "dead"
    assert queue.redis.llen(queue.keys.pool_wake) == 1  # w2 still idles: the safety token
    early = claim_reply(queue, "w2", 19, now_ms=T0 + 20)
    # its pickup deadline (T0 + 510), + 1 ms, rounded up to 100 ms as a lookout's time is
    assert early.task is None and early.retry_s == (600 - 20) / 1000
    c = claim(queue, "w2", 19, now_ms=T0 + 10 + 500 + 1)
    assert c is not None and c["id"] == tid and c["attempt"] == "1"  # the first was given back
    assert queue.redis.zscore(queue.keys.handed, tid) is None
    # off the dead worker's wake list: were it only slow, it could not run the task twice
    assert queue.redis.lrange(queue.keys.wake("dead"), 0, -1) == []
    handed_token = "1"  # the first token of the pool
    assert c["token"] != handed_token
    assert tid in heartbeat(queue, "dead", [(tid, handed_token)], now_ms=T0 + 600)  # fenced off


def test_the_reaper_takes_back_an_unread_hand_over_where_no_worker_claims(queue: Queue) -> None:
    register(queue, "dead")
    tid = enqueue(queue, T0 + 10, priority="P0", model="m", vram_gb=1)
    assert reap(queue, now_ms=T0 + 10 + 99).requeued == 0  # its deadline is not past yet
    assert queue.record(tid).state is State.RUNNING
    reap(queue, now_ms=T0 + 10 + 100)
    r = queue.record(tid)
    assert (r.state, r.attempt, r.worker) == (State.QUEUED, 0, None)
    assert queue.redis.zcard(queue.keys.handed) == 0
    assert queue.redis.lrange(queue.keys.wake("dead"), 0, -1) == []


def test_a_bulk_call_wakes_the_worker_so_its_claim_picks_the_best_of_the_batch(
        queue: Queue) -> None:
    register(queue, "w1")
    first, urgent = (t.id for t in queue.enqueue_many(
        [{"handler": "h", "model": "m", "vram_gb": 1, "priority": "P3"},
         {"handler": "h", "model": "m", "vram_gb": 1, "priority": "P0"}]))
    assert queue.record(first).state is State.QUEUED
    assert queue.redis.lrange(queue.keys.wake("w1"), 0, -1) == ["1"]
    c = claim(queue, "w1", 19)
    assert c is not None and c["id"] == urgent


def test_workers_with_more_slots_or_no_hand_overs_are_woken_instead(queue: Queue) -> None:
    register(queue, "two", slots=2)
    tid = enqueue(queue, T0 + 10, model="m", vram_gb=4)
    assert queue.record(tid).state is State.QUEUED
    assert queue.redis.lrange(queue.keys.wake("two"), 0, -1) == ["1"]
    register(queue, "burst", handover=False)
    tid = enqueue(queue, T0 + 20, model="m", vram_gb=4)
    assert queue.record(tid).state is State.QUEUED
    assert queue.redis.lrange(queue.keys.wake("burst"), 0, -1) == ["1"]


def test_a_cold_hand_over_notes_when_its_model_should_be_loaded(queue: Queue) -> None:
    pipe = queue.redis.pipeline(transaction=False)
    catalog.record_load(pipe, queue.keys, "m", 4, 1.5)
    pipe.execute()
    register(queue, "w1")  # holds nothing: it loads "m" first
    tid = enqueue(queue, T0 + 10, priority="P0", model="m", vram_gb=4)
    assert queue.redis.hget(queue.keys.task(tid), "ready_at") == str(T0 + 10 + 1500)


def test_batch_work_is_not_handed_cold_to_an_idle_worker_while_a_busy_holder_soon_frees(
        queue: Queue) -> None:
    """The claim leaves a cold P2/P3 task for a busy holder of its model that gets to it
    within its holder wait; a hand-over must not start it cold on an idle worker instead."""
    register(queue, "holder")
    first = enqueue(queue, T0 + 10, priority="P2", model="m", vram_gb=4, est_s=1)
    token = pop_wake(queue, "holder")["token"]
    queue.redis.sadd(queue.keys.holders("m"), "holder")  # its load done, as presence writes
    register(queue, "cold")
    tid = enqueue(queue, T0 + 20, priority="P2", model="m", vram_gb=4, est_s=1)
    assert queue.record(tid).state is State.QUEUED  # not started on "cold"
    c = claim_reply(queue, "cold", 19, now_ms=T0 + 30)
    assert c.task is None and c.retry_s > 0  # left for the holder, which frees up in ~1 s
    ack(queue, first, int(token), now_ms=T0 + 1_000)
    got = claim(queue, "holder", 15, loaded=[("m", 4)], now_ms=T0 + 1_000)
    assert got is not None and got["id"] == tid
