"""Contract suite, part 3: tasks handed over at enqueue to an idle one-slot worker.

Each test runs on fakeredis and on the real server (the ``backend`` fixture). The worker
side (reading the hand-over, confirming it before the handler) is tested with real worker
processes in test_worker.py and test_fault.py.
"""

from __future__ import annotations

import json

from helpers import T0, claim, claim_reply, enqueue, heartbeat

from gpuq import Queue
from gpuq.task import State
from gpuq.worker import presence
from gpuq.worker.gpu import GpuInfo

LEASE_MS, DEFER_MS, FAIR_EVERY = 30_000, 2_000, 5


def register(q: Queue, wid: str, *, slots: int = 1, handover: bool = True) -> None:
    """A worker as presence writes it, then idle: its claim found nothing."""
    gpu = GpuInfo("L4", f"uuid-{wid}", 24, None, "declared")
    fields = presence.identity(wid, gpu, 5.0, slots, "0123", "h", 1,
                               (DEFER_MS, FAIR_EVERY) if handover else None)
    presence.register(q.redis, q.keys, fields, LEASE_MS)
    assert claim(q, wid, 19, slots=slots, now_ms=T0) is None


def test_an_idle_one_slot_worker_is_handed_the_task_started(queue: Queue) -> None:
    register(queue, "w1")
    tid = enqueue(queue, T0 + 10, priority="P0", model="m", vram_gb=4, est_s=0.5)
    r = queue.record(tid)
    assert (r.state, r.worker, r.attempt) == (State.RUNNING, "w1", 1)
    assert queue.redis.zscore(queue.keys.idle, "w1") is None
    # leased only until its pickup deadline: P0's defer bound, min(2 s, SLA / 2)
    assert queue.redis.zscore(queue.keys.running, tid) == T0 + 10 + 100
    assert queue.redis.zscore(queue.keys.handed, tid) == T0 + 10 + 100
    assert queue.redis.zcard(queue.keys.queue(0, "m")) == 0
    (message,) = queue.redis.lrange(queue.keys.wake("w1"), 0, -1)
    fields = json.loads(message)
    token = queue.redis.hget(queue.keys.task(tid), "token")
    assert fields["id"] == tid and fields["token"] == token and fields["attempt"] == "1"
    assert (fields["model"], fields["vram_gb"], fields["priority"], fields["est_s"]) == ("m", "4", "0", "0.5")
    assert queue.redis.hget(queue.keys.stats, "sla_met:P0") == "1"


def test_a_heartbeat_confirms_the_pickup_with_the_full_lease(queue: Queue) -> None:
    register(queue, "w1")
    tid = enqueue(queue, T0 + 10, model="m", vram_gb=4)
    token = queue.redis.hget(queue.keys.task(tid), "token")
    assert heartbeat(queue, "w1", [(tid, token)], now_ms=T0 + 20) == []
    assert queue.redis.zscore(queue.keys.handed, tid) is None
    assert queue.redis.zscore(queue.keys.running, tid) == T0 + 20 + LEASE_MS


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
    assert early.task is None and early.retry_s == (10 + 500 - 20 + 1) / 1000
    c = claim(queue, "w2", 19, now_ms=T0 + 10 + 500 + 1)
    assert c is not None and c["id"] == tid and c["attempt"] == "1"  # the first was given back
    assert queue.redis.zscore(queue.keys.handed, tid) is None
    handed_token = "1"  # the first token of the pool
    assert c["token"] != handed_token
    assert tid in heartbeat(queue, "dead", [(tid, handed_token)], now_ms=T0 + 600)  # fenced off


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
