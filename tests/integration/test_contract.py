"""Contract suite, part 1: enqueue and the claim's scheduling rules.

Every test runs twice, on fakeredis and on the real server (the ``backend`` fixture), so the
same scenarios prove the Lua scripts on both. Leases, retries, cancel and reap: in
test_contract_leases.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from helpers import (
    ENQUEUE_FIELDS,
    ENQUEUE_HEAD,
    T0,
    ack,
    claim,
    claim_reply,
    enqueue,
    pool_keys,
    raw_enqueue_call,
    register_worker,
    reserve,
    spec,
    task_keys,
)
from redis.backoff import NoBackoff
from redis.retry import Retry

from gpuq import Queue, bulk, catalog
from gpuq.embedded import EmbeddedServer
from gpuq.errors import DuplicateTask, InvalidTask, PartialEnqueue, UnregisteredHandler, Unschedulable
from gpuq.reaper.preempt import Preemptor, may_be_asked
from gpuq.scripts import Call, Claim, ClaimRequest
from gpuq.task import Priority, State
from gpuq.tenants import Tenant, set_tenant
from gpuq.wire import exchange, kept_connection
from gpuq.work_index import member

MakeQueue = Callable[..., Queue]
DOCUMENTED = {"id", "handler", "payload", "model", "vram_gb", "priority", "est_s", "deadline",
              "preemptible", "tenant", "max_attempts", "attempt", "state", "worker",
              "enqueued_at", "started_at", "finished_at", "result", "error"}


def task(**options: object) -> dict[str, object]:
    return {"handler": "h", "model": "A", "vram_gb": 1, **options}


def test_enqueue_then_record_has_every_documented_field(queue: Queue) -> None:
    before = time.time()
    t = queue.enqueue("llm.generate", {"prompt": "hi"}, model="llama3-8b", vram_gb=16,
                      priority="online", est_s=0.4, deadline_s=2, preemptible=False,
                      tenant="acme", max_attempts=2)
    r = queue.record(t.id)
    assert DOCUMENTED <= set(r.to_dict())
    assert (r.id, r.handler, r.payload, r.model, r.vram_gb) == (
        t.id, "llm.generate", {"prompt": "hi"}, "llama3-8b", 16.0)
    assert (r.priority, r.est_s, r.preemptible, r.tenant, r.max_attempts, r.attempt) == (
        Priority.P0, 0.4, False, "acme", 2, 0)
    assert r.state is State.QUEUED and r.worker is None and r.result is None and r.error is None
    assert before - 1 < r.enqueued_at < time.time() + 1  # epoch seconds, not ms
    assert r.deadline == pytest.approx(r.enqueued_at + 2, abs=0.002)
    assert r.started_at is None and r.finished_at is None

    c = claim(queue, "w1", 40)
    assert c is not None and c["id"] == t.id
    ack(queue, t.id, c["token"], {"text": "hello"})
    r = queue.record(t.id)
    assert r.state is State.SUCCEEDED and r.worker == "w1" and r.attempt == 1
    assert r.result == {"text": "hello"} and r.error is None
    assert r.started_at is not None and r.finished_at is not None
    assert r.enqueued_at <= r.started_at <= r.finished_at < time.time() + 1
    assert t.result(timeout=1) == {"text": "hello"}


def test_p0_behind_1000_queued_p3_is_the_next_claim(queue: Queue) -> None:
    queue.enqueue_many([task(priority="P3") for _ in range(1000)])
    urgent = queue.enqueue("h", model="A", vram_gb=1, priority="P0")
    c = claim(queue, "w1", 10)
    assert c is not None and c["id"] == urgent.id


@pytest.mark.parametrize("n", [5, 2])
def test_fairness_one_lower_dispatch_after_every_n_higher(make_queue: MakeQueue, n: int) -> None:
    q = make_queue(fair_every=n)
    q.enqueue_many([task(priority="P0") for _ in range(40)] +
                   [task(priority="P3", model="B") for _ in range(20)])
    rounds = 5
    got = []
    for _ in range(rounds * (n + 1)):
        c = claim(q, "w1", 10)
        assert c is not None
        got.append(int(c["priority"]))
    assert got == ([0] * n + [3]) * rounds
    assert got.count(3) == rounds  # exactly K / (N + 1) of K dispatches


def test_fairness_applies_only_while_the_lower_level_has_work(make_queue: MakeQueue) -> None:
    q = make_queue(fair_every=2)
    q.enqueue_many([task(priority="P0") for _ in range(6)])
    for _ in range(6):
        assert claim(q, "w1", 10) is not None
    q.enqueue_many([task(priority="P0") for _ in range(3)] + [task(priority="P3")])
    got = [int(claim(q, "w1", 10)["priority"]) for _ in range(4)]  # type: ignore[index]
    assert got == [0, 0, 3, 0]  # no credit banked while P3 was empty


def test_affinity_prefers_a_held_model_over_an_older_task(queue: Queue) -> None:
    old_b = enqueue(queue, T0, model="B", vram_gb=12)
    new_a = enqueue(queue, T0 + 1000, model="A", vram_gb=12)
    c = claim(queue, "holder", 20, loaded=[("A", 10)], now_ms=T0 + 5000)
    assert c is not None and c["id"] == new_a
    c = claim(queue, "cold", 20, now_ms=T0 + 5000)  # holds nothing: oldest first
    assert c is not None and c["id"] == old_b


def test_fit_a_40gb_task_never_goes_to_a_24gb_gpu(queue: Queue) -> None:
    tid = enqueue(queue, T0, vram_gb=40)
    assert claim(queue, "l4", 24 - 5, now_ms=T0 + 10) is None  # 24 GB minus the 5 GB reserve
    assert claim(queue, "l4", 19, evictable_gb=20, now_ms=T0 + 20) is None
    assert queue.record(tid).state is State.QUEUED
    c = claim(queue, "h100", 80 - 5, now_ms=T0 + 30)
    assert c is not None and c["id"] == tid and float(c["vram_gb"]) <= 75


def test_fit_counts_evictable_vram_and_a_held_models_footprint(queue: Queue) -> None:
    cold = enqueue(queue, T0, model="A", vram_gb=40)
    c = claim(queue, "w1", 10, evictable_gb=30, now_ms=T0 + 1)  # 40 <= free + evictable
    assert c is not None and c["id"] == cold
    held = enqueue(queue, T0 + 2, model="B", vram_gb=40)
    assert claim(queue, "w2", 9, loaded=[("B", 30)], now_ms=T0 + 3) is None  # 10 extra > 9
    c = claim(queue, "w2", 10, loaded=[("B", 30)], now_ms=T0 + 4)
    assert c is not None and c["id"] == held


@pytest.mark.parametrize("fits_at", [1, 2, 3, 8, 9])
def test_a_claim_reads_past_the_first_two_tasks_up_to_the_scan(queue: Queue, fits_at: int) -> None:
    """The claim reads a queue's first two tasks, then the rest of its scan (8) when neither
    runs here: the first that fits within the scan is taken, one past it is not."""
    ids = [enqueue(queue, T0 + i, model="A", vram_gb=30 if i + 1 != fits_at else 5) for i in range(10)]
    c = claim(queue, "w1", 6, loaded=[("A", 1)], now_ms=T0 + 20)
    if fits_at <= 8:
        assert c is not None and c["id"] == ids[fits_at - 1]
    else:
        assert c is None
    assert queue.redis.zcard(queue.keys.queue(2, "A")) == 10 - (fits_at <= 8)


def test_a_held_models_task_fits_in_the_room_of_the_workers_other_idle_models(
        queue: Queue) -> None:
    # 75 GB usable holding A and B (30 GB each, idle): 15 GB free, 60 evictable, idle score
    # 75. A task of A needing 50 GB (20 beyond A's weights) is offered to it: its claim must
    # take it, B evicted; refusing it would pass it to another worker, which passes it back
    held = {"free_gb": 15, "evictable_gb": 60, "loaded": [("A", 30), ("B", 30)]}
    assert claim(queue, "w1", now_ms=T0, **held) is None
    queue.redis.sadd(queue.keys.holders("A"), "w1")
    tid = enqueue(queue, T0 + 1, model="A", vram_gb=50)
    assert queue.redis.lrange(queue.keys.wake("w1"), 0, -1) == ["1"]
    c = claim(queue, "w1", now_ms=T0 + 2, **held)
    assert c is not None and c["id"] == tid
    # 46 GB beyond A's weights: more than free plus B
    enqueue(queue, T0 + 3, model="A", vram_gb=76)
    assert claim(queue, "w1", now_ms=T0 + 4, **held) is None
    # a reservation for a held model's task is taken by the same rule
    reserved = enqueue(queue, T0 + 5, model="B", vram_gb=70)
    reserve(queue, "w1", reserved, T0 + 60_000)
    c = claim(queue, "w1", now_ms=T0 + 6, **held)
    assert c is not None and c["id"] == reserved


def test_a_reservation_ends_at_its_expiry_on_the_callers_clock(queue: Queue) -> None:
    # preempt.lua writes "<task> <expires ms>", so the caller's clock (a replay's virtual
    # one) decides when it ends, not the server's wall clock
    victim = enqueue(queue, T0, model="B", vram_gb=10, priority="P3")
    c = claim(queue, "w1", 75, now_ms=T0)
    assert c is not None and c["id"] == victim
    queue.redis.zadd(queue.keys.workers, {"w1": T0 + 10**9})  # live
    waiting = enqueue(queue, T0 + 1, model="A", vram_gb=60, priority="P0")

    def preempt(now_ms: int) -> tuple[str, str]:
        return queue.scripts.run(queue.calls.preempt(waiting, "w1", victim, int(c["token"]),
                                                     reserve_ms=1000, grace_ms=None, now_ms=now_ms))

    assert preempt(T0 + 10) == ("reserved", "")
    assert queue.redis.get(queue.keys.reservation("w1")) == f"{waiting} {T0 + 1010}"
    # the worker is told, so a batch waiting there to fill up runs at once
    assert queue.redis.lrange(queue.keys.control("w1"), 0, -1) == [f"reserved {waiting}"]
    assert preempt(T0 + 1009) == ("stale", "worker is already reserved")
    assert preempt(T0 + 1010) == ("reserved", "")  # the first one has expired: renewed
    assert queue.redis.get(queue.keys.reservation("w1")) == f"{waiting} {T0 + 2010}"
    ack(queue, victim, c["token"], now_ms=T0 + 1500)
    other = enqueue(queue, T0 + 1500, model="C", vram_gb=10, priority="P1")
    # while the reservation lives, the worker waits for its task (60 GB: not in 30 free)
    assert claim_reply(queue, "w1", 30, now_ms=T0 + 2009) == Claim(None, 0.2)
    # expired by the claim's clock: the worker claims as if never reserved (the gate tells the
    # claim no reservation lives, so it does not read the key, which stays, expired)
    c = claim(queue, "w1", 30, now_ms=T0 + 2010)
    assert c is not None and c["id"] == other
    assert queue.redis.hget(queue.keys.fairness, "reserved_until") == str(T0 + 2010)


def test_a_yield_request_is_withdrawn_when_its_task_starts_elsewhere_or_ends(queue: Queue) -> None:
    keys = queue.keys
    victims = {}
    for w in ("w1", "w2"):
        victims[w] = enqueue(queue, T0, model="B", vram_gb=30, priority="P3")
        c = claim(queue, w, 75, now_ms=T0)
        assert c is not None and c["id"] == victims[w]
        victims[w] = (c["id"], int(c["token"]))
        queue.redis.zadd(keys.workers, {w: T0 + 10**9})  # live

    def ask(waiting: str, w: str, now_ms: int) -> tuple[str, str]:
        victim, token = victims[w]
        return queue.scripts.run(queue.calls.preempt(waiting, w, victim, token, reserve_ms=60_000,
                                                     grace_ms=5000, now_ms=now_ms))

    # the request not yet read by w1 is taken off its control list when the task starts on w3
    first = enqueue(queue, T0 + 1, model="A", vram_gb=30, priority="P0")
    assert ask(first, "w1", T0 + 2) == ("yield", "")
    assert queue.redis.lrange(keys.control("w1"), 0, -1) == [f"yield {victims['w1'][0]} 5000"]
    c = claim(queue, "w3", 75, now_ms=T0 + 3)
    assert c is not None and c["id"] == first
    assert queue.redis.lrange(keys.control("w1"), 0, -1) == []
    assert queue.redis.exists(keys.reservation("w1")) == 0
    assert queue.redis.hmget(keys.task(victims["w1"][0]), "yield_by", "yield_for") == [None, None]
    # one w2 has read already is undone by "unyield" when its task is canceled
    second = enqueue(queue, T0 + 4, model="A", vram_gb=30, priority="P0")
    assert ask(second, "w2", T0 + 5) == ("yield", "")
    assert queue.redis.lpop(keys.control("w2")) == f"yield {victims['w2'][0]} 5000"
    queue.scripts.run(queue.calls.cancel(second, now_ms=T0 + 6))
    assert queue.redis.lrange(keys.control("w2"), 0, -1) == [f"unyield {victims['w2'][0]}"]
    assert queue.redis.exists(keys.reservation("w2")) == 0
    assert queue.redis.hget(keys.stats, "preempt:withdrawn") == "2"
    # w2 passing the grace before it reads "unyield": its stop leaves the task running
    victim, token = victims["w2"]
    assert queue.scripts.run(queue.calls.requeue(victim, token, "stopped", preempted="stopped",
                                                 now_ms=T0 + 6)) == "kept"
    assert queue.redis.hmget(keys.task(victim), "state", "token") == ["running", str(token)]
    assert queue.redis.hget(keys.stats, "preempt:stopped") is None
    # a victim that has yielded is not told anything
    third = enqueue(queue, T0 + 7, model="A", vram_gb=30, priority="P0")
    assert ask(third, "w1", T0 + 8) == ("yield", "")
    queue.redis.delete(keys.control("w1"))
    victim, token = victims["w1"]
    queue.scripts.run(queue.calls.requeue(victim, token, "yielded", preempted="yielded",
                                          now_ms=T0 + 9))
    c = claim(queue, "w1", 75, now_ms=T0 + 10)
    assert c is not None and c["id"] == third
    assert queue.redis.lrange(keys.control("w1"), 0, -1) == []
    assert queue.redis.hget(keys.stats, "preempt:withdrawn") == "2"


def test_several_victims_on_one_worker_are_asked_together_and_withdrawn_together(queue: Queue) -> None:
    """A group running two tasks, neither of whose ends alone makes room: both are asked in
    one call (checked whole first), and a start elsewhere withdraws both requests."""
    keys = queue.keys
    runs = []
    for _ in range(2):
        tid = enqueue(queue, T0, model="B", vram_gb=70, priority="P2")
        c = claim(queue, "g2", 150, now_ms=T0, slots=2)
        assert c is not None and c["id"] == tid
        runs.append((tid, int(c["token"])))
    queue.redis.zadd(keys.workers, {"g2": T0 + 10**9})  # live
    (a, ta), (b, tb) = runs

    def ask(waiting: str, also: list[tuple[str, int]], now_ms: int) -> tuple[str, str]:
        return queue.scripts.run(queue.calls.preempt(waiting, "g2", a, ta, reserve_ms=60_000,
                                                     grace_ms=5000, now_ms=now_ms, also=also))

    wide = enqueue(queue, T0 + 1, model="A", vram_gb=140, priority="P0")
    # one of them stale (a wrong token): nothing is written
    assert ask(wide, [(b, tb + 1)], T0 + 2) == ("stale", "victim is no longer running there")
    assert queue.redis.exists(keys.reservation("g2")) == 0 and not queue.redis.hget(keys.task(a), "yield_by")
    assert ask(wide, [(b, tb)], T0 + 2) == ("yield", "")
    assert queue.redis.lrange(keys.control("g2"), 0, -1) == [f"yield {b} 5000", f"yield {a} 5000"]
    assert queue.redis.hget(keys.task(wide), "yield_victim") == f"{a} {b}"
    assert [queue.redis.hget(keys.task(v), "yield_for") for v in (a, b)] == [wide, wide]
    assert queue.redis.hget(keys.stats, "preempt:yield_requested") == "2"
    # the waiting task starts elsewhere: both requests are taken back
    c = claim(queue, "w9", 150, now_ms=T0 + 3)
    assert c is not None and c["id"] == wide
    assert queue.redis.lrange(keys.control("g2"), 0, -1) == []
    assert [queue.redis.hget(keys.task(v), "yield_by") for v in (a, b)] == [None, None]
    assert queue.redis.hget(keys.stats, "preempt:withdrawn") == "2"
    assert queue.redis.exists(keys.reservation("g2")) == 0


def test_a_bulk_enqueue_is_claimed_in_the_order_it_was_made(queue: Queue) -> None:
    # one call: every task has the same score, and the queue orders equal scores by id
    made = [t.id for t in queue.enqueue_many([task(payload={"i": i}) for i in range(300)])]
    got = [c["id"] for c in iter(lambda: claim(queue, "w", 75), None)]
    assert got == made


def test_cold_task_waits_for_a_tighter_idle_worker_until_the_defer_bound(
        make_queue: MakeQueue) -> None:
    q = make_queue(defer_s=2.0)  # P2 bound: min(2 s, SLA / 2) = 2000 ms
    for worker, free in (("tightest", 26), ("tight", 30), ("loose", 80)):
        assert claim(q, worker, free, now_ms=T0) is None  # nothing queued: each goes idle
    assert q.redis.zcard(q.keys.idle) == 3
    tid = enqueue(q, T0 + 10, vram_gb=25)
    # enqueue woke the tightest fit and took it out of the idle set: it will claim next
    assert q.redis.lrange(q.keys.wake("tightest"), 0, -1) == ["1"]
    assert q.redis.zscore(q.keys.idle, "tightest") is None
    # "loose" asks first, but "tight" is idle and fits the task more tightly
    assert claim(q, "loose", 80, now_ms=T0 + 10 + 1999) is None
    assert q.record(tid).state is State.QUEUED
    c = claim(q, "loose", 80, now_ms=T0 + 10 + 2000)  # waited past the bound: taken anyway
    assert c is not None and c["id"] == tid


def test_the_tighter_idle_worker_takes_a_cold_task_at_once(queue: Queue) -> None:
    for worker, free in (("tight", 30), ("loose", 80)):
        assert claim(queue, worker, free, now_ms=T0) is None
    tid = enqueue(queue, T0 + 10, vram_gb=25)  # wakes "tight"
    c = claim(queue, "tight", 30, now_ms=T0 + 11)
    assert c is not None and c["id"] == tid


def test_a_cold_task_is_not_left_for_a_tighter_worker_already_running_tasks(queue: Queue) -> None:
    first = enqueue(queue, T0, model="B", vram_gb=20)
    second = enqueue(queue, T0 + 5, vram_gb=25)
    c = claim(queue, "multi", 50, slots=2, now_ms=T0 + 10)  # runs two at once
    assert c is not None and c["id"] == first
    assert queue.redis.zscore(queue.keys.idle, "multi") == 30  # a free slot: still idle
    # "multi" fits the second task more tightly, but it is running one: "single" takes it
    c = claim(queue, "single", 80, now_ms=T0 + 11)
    assert c is not None and c["id"] == second


def test_cold_task_waits_for_an_idle_holder_of_its_model(queue: Queue) -> None:
    for worker in ("h1", "h2"):
        assert claim(queue, worker, 10, loaded=[("A", 8)], now_ms=T0) is None
        queue.redis.sadd(queue.keys.holders("A"), worker)
    tid = enqueue(queue, T0 + 10, vram_gb=9)  # wakes one holder; the other stays idle
    assert claim(queue, "cold", 70, now_ms=T0 + 11) is None
    c = claim(queue, "cold", 70, now_ms=T0 + 10 + 2000)
    assert c is not None and c["id"] == tid


def hold_model(q: Queue, worker: str, model: str, total_gb: float, levels: str = "0123") -> None:
    """A registered worker that holds a model and is not idle (busy)."""
    q.redis.hset(q.keys.worker(worker), mapping={"vram_total_gb": total_gb, "kv_reserve_gb": 5,
                                                 "levels": levels})
    q.redis.sadd(q.keys.holders(model), worker)


def test_batch_work_waits_for_a_busy_holder_of_its_model_online_work_does_not(
        make_queue: MakeQueue) -> None:
    q = make_queue(defer_s=2.0, holder_wait_s=120.0)  # P2: min(120 s, SLA / 2 = 150 s)
    hold_model(q, "busy", "A", 80)
    batch = enqueue(q, T0, model="A", vram_gb=30, priority="P2")
    online = enqueue(q, T0, model="A", vram_gb=30, priority="P0")
    c = claim(q, "cold", 75, now_ms=T0 + 1)
    assert c is not None and c["id"] == online  # online work never waits for a busy GPU
    r = claim_reply(q, "cold", 75, now_ms=T0 + 3000)  # past the 2 s defer bound
    assert r.task is None and r.retry_s == pytest.approx(117.0)
    c = claim(q, "busy", 75, loaded=[("A", 20)], now_ms=T0 + 4000)  # the holder frees up
    assert c is not None and c["id"] == batch


def busy_with(q: Queue, worker: str, model: str, now_ms: int, **options: object) -> str:
    """A worker (80 GB) holding ``model`` and running one task of it, started at now_ms."""
    tid = enqueue(q, now_ms, model=model, vram_gb=20, **options)
    c = claim(q, worker, 75, loaded=[(model, 15)], now_ms=now_ms)
    assert c is not None and c["id"] == tid
    hold_model(q, worker, model, 80)
    return tid


def test_online_work_is_offered_to_a_busy_holder_whose_batch_task_may_yield(queue: Queue) -> None:
    busy_with(queue, "holder", "A", T0, priority="P3")
    assert claim(queue, "cold", 70, now_ms=T0 + 1) is None  # idle, without model A
    online = enqueue(queue, T0 + 10, model="A", vram_gb=20, priority="P0")
    # offered to the holder (the planner may ask its P3 task to yield), not woken; the
    # reaper is woken to plan; the idle worker without the model is not woken
    assert queue.redis.hget(queue.keys.task(online), "offered") == "holder"
    assert queue.redis.llen(queue.keys.wake("holder")) == 0
    assert queue.redis.llen(queue.keys.wake("cold")) == 0
    assert queue.redis.llen(queue.keys.urgent) == 1
    # the idle worker leaves it to the holder for the P0 defer bound (SLA / 2), then loads it
    assert claim(queue, "cold", 70, now_ms=T0 + 10 + 99) is None
    c = claim(queue, "cold", 70, now_ms=T0 + 10 + 100)
    assert c is not None and c["id"] == online


@pytest.mark.parametrize("running", [{"priority": "P3", "preemptible": False},
                                     {"priority": "P0"}])
def test_online_work_is_not_offered_to_a_holder_whose_task_may_not_yield(
        queue: Queue, running: dict[str, object]) -> None:
    busy_with(queue, "holder", "A", T0, **running)
    assert claim(queue, "cold", 70, now_ms=T0 + 1) is None
    online = enqueue(queue, T0 + 10, model="A", vram_gb=20, priority="P1")
    assert queue.redis.hget(queue.keys.task(online), "offered") == "cold"
    assert queue.redis.lrange(queue.keys.wake("cold"), 0, -1) == ["1"]


def test_batch_work_is_not_offered_to_a_busy_holder(queue: Queue) -> None:
    busy_with(queue, "holder", "A", T0, priority="P3")
    assert claim(queue, "cold", 70, now_ms=T0 + 1) is None
    batch = enqueue(queue, T0 + 10, model="A", vram_gb=20, priority="P2")
    assert queue.redis.hget(queue.keys.task(batch), "offered") == "cold"


def test_a_backlog_deeper_than_its_busy_holders_is_loaded_elsewhere(make_queue: MakeQueue) -> None:
    q = make_queue(defer_s=2.0, holder_wait_s=120.0)
    hold_model(q, "busy", "A", 80)
    first = enqueue(q, T0, model="A", vram_gb=30, priority="P2", est_s=200)
    second = enqueue(q, T0 + 1, model="A", vram_gb=30, priority="P2", est_s=200)
    # the holder would reach the second task only after the first (200 s), past the 117 s it
    # may still wait: it is taken here; the first waits for the holder
    c = claim(q, "cold", 75, now_ms=T0 + 3000)
    assert c is not None and c["id"] == second
    assert q.record(first).state is State.QUEUED
    # short tasks: the holder reaches the second one (after 5 s) within the wait
    for i in range(2):
        enqueue(q, T0 + 10 + i, model="B", vram_gb=30, priority="P2", est_s=5)
    hold_model(q, "busy", "B", 80)
    hold_model(q, "busy2", "A", 80)  # and two holders of A: the first A task waits too
    r = claim_reply(q, "cold2", 75, now_ms=T0 + 3000)
    assert r.task is None and r.retry_s > 100


@pytest.mark.parametrize("holder_task_s, waits", [(100, True), (200, False)])
def test_batch_work_waits_only_for_a_holder_that_frees_up_within_the_wait(
        make_queue: MakeQueue, holder_task_s: float, waits: bool) -> None:
    q = make_queue(defer_s=2.0, holder_wait_s=120.0)
    hold_model(q, "busy", "A", 80)
    running = enqueue(q, T0, model="A", vram_gb=30, priority="P2", est_s=holder_task_s)
    c = claim(q, "busy", 75, loaded=[("A", 20)], now_ms=T0)
    assert c is not None and c["id"] == running  # the holder runs it from T0
    tid = enqueue(q, T0 + 1, model="A", vram_gb=30, priority="P2", est_s=5)
    # at T0 + 3 s the task may wait 117 s more: the holder expects to free up in 97 s (wait)
    # or in 197 s (it would be loaded cold then anyway: load it here now)
    c = claim(q, "cold", 75, now_ms=T0 + 3000)
    assert (c is None) is waits
    assert waits or (c is not None and c["id"] == tid)


def test_batch_work_is_taken_cold_once_the_holder_wait_is_over(make_queue: MakeQueue) -> None:
    q = make_queue(defer_s=2.0, holder_wait_s=120.0)
    hold_model(q, "busy", "A", 80)
    tid = enqueue(q, T0, model="A", vram_gb=30, priority="P3")
    assert claim(q, "cold", 75, now_ms=T0 + 119_999) is None
    c = claim(q, "cold", 75, now_ms=T0 + 120_000)
    assert c is not None and c["id"] == tid


@pytest.mark.parametrize("holder", ["too small", "idle", "other lane"])
def test_a_holder_that_could_not_take_the_task_is_not_waited_for(
        make_queue: MakeQueue, holder: str) -> None:
    q = make_queue(defer_s=2.0, holder_wait_s=120.0)
    hold_model(q, "h", "A", 24 if holder == "too small" else 80,
               levels="01" if holder == "other lane" else "0123")
    if holder == "idle":  # an idle holder that did not take the task has no room for it
        q.redis.zadd(q.keys.idle, {"h": 1})
    tid = enqueue(q, T0, model="A", vram_gb=30, priority="P2")
    c = claim(q, "cold", 75, now_ms=T0 + 2000)  # past the defer bound only
    assert c is not None and c["id"] == tid


def test_a_stale_idle_entry_of_the_claimer_does_not_hide_a_tighter_worker(
        queue: Queue) -> None:
    for worker, free in (("tiny", 25), ("tight", 30)):
        assert claim(queue, worker, free, now_ms=T0) is None
    queue.redis.zadd(queue.keys.idle, {"loose": 26})  # loose's entry from an earlier claim
    tid = enqueue(queue, T0 + 10, vram_gb=25)  # wakes "tiny"
    assert claim(queue, "loose", 80, now_ms=T0 + 11) is None  # "tight" (30) is better
    c = claim(queue, "loose", 80, now_ms=T0 + 10 + 2000)
    assert c is not None and c["id"] == tid


def test_bulk_enqueue_of_1000_tasks(queue: Queue) -> None:
    tasks = queue.enqueue_many([task(payload={"i": i}, priority=i % 4) for i in range(1000)])
    assert len({t.id for t in tasks}) == 1000
    assert sum(queue.redis.zcard(queue.keys.queue(p, "A")) for p in range(4)) == 1000
    assert len(task_keys(queue)) == 1000
    assert queue.record(tasks[999].id).payload == {"i": 999}


def test_bulk_enqueue_with_one_invalid_task_writes_nothing(queue: Queue) -> None:
    batch = [task() for _ in range(1000)]
    batch[700] = task(vram_gb=-1)
    with pytest.raises(InvalidTask, match="vram_gb"):
        queue.enqueue_many(batch)
    assert pool_keys(queue) == set()


def test_bulk_enqueue_rejected_by_the_server_writes_nothing(queue: Queue) -> None:
    batch = [task() for _ in range(100)] + [task(task_id="same"), task(task_id="same")]
    with pytest.raises(DuplicateTask):
        queue.enqueue_many(batch)
    assert pool_keys(queue) == set()


def test_bulk_enqueue_streams_its_chunks_and_reloads_lost_scripts(queue: Queue) -> None:
    queue.redis.script_flush()  # a restarted server: every streamed call finds no script
    tasks = queue.enqueue_many([task(payload={"i": i}) for i in range(450)])
    assert len(task_keys(queue)) == 450
    assert queue.record(tasks[449].id).payload == {"i": 449}


def test_calls_go_on_over_a_connection_the_server_dropped(real_queue: Queue,
                                                         redis_server: EmbeddedServer) -> None:
    """Scripts and the result wait run on bare pooled connections: one the server closed
    (a restart, a timeout, a failover) is reconnected and the command sent again, as the
    client does for its own commands."""
    q = real_queue
    killer = redis.Redis.from_url(redis_server.url)

    def drop_connections() -> None:
        assert killer.client_kill_filter(_type="normal", skipme=True) >= 1

    first = q.enqueue("h", model="A", vram_gb=1)
    drop_connections()
    second = q.enqueue("h", model="A", vram_gb=1)
    drop_connections()
    c = claim(q, "w1", 40)
    assert c is not None and c["id"] == first.id
    ack(q, first.id, c["token"], {"ok": 1})
    drop_connections()
    assert first.result(timeout=5) == {"ok": 1}
    assert q.record(second.id).state is State.QUEUED
    killer.close()


def test_a_call_whose_connection_breaks_mid_way_follows_the_clients_retry_policy(
        real_queue: Queue) -> None:
    """A connection that breaks while a call is sent is reconnected and the call sent again
    as the client's retry policy says (none by default with a URL; one retry here)."""
    q = real_queue
    q.redis.set_retry(Retry(NoBackoff(), 1))
    q.enqueue("h", model="A", vram_gb=1)  # the client now keeps a connection for its calls
    conn = kept_connection(q.redis)
    broken = []

    class BrokenOnce:
        """The connection's socket, whose first write fails: nothing reaches the server."""

        def __init__(self, sock: Any) -> None:
            self.sock = sock

        def sendall(self, data: bytes) -> None:
            if not broken:
                broken.append(1)
                raise ConnectionResetError(104, "Connection reset by peer")
            self.sock.sendall(data)

        def pending(self) -> int:  # as a TLS socket's: nothing decrypted waits
            return 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

    conn._sock = BrokenOnce(conn._sock)
    t = q.enqueue("h", model="A", vram_gb=1)
    assert broken and q.record(t.id).state is State.QUEUED


def test_calls_on_a_plain_kept_connection_skip_redis_pys_send_and_read(
        real_queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain connection's calls go bare (gpuq.wire._bare), one the server closed is
    dropped first, and a server error comes back as the reply it is."""
    q = real_queue
    q.enqueue("h", model="A", vram_gb=1)
    conn = kept_connection(q.redis)
    plain = redis.connection.AbstractConnection
    if type(conn).read_response is not plain.read_response:
        pytest.skip("a Cluster's or Sentinel's connection reads MOVED or READONLY itself: redis-py's read")

    def refused(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("redis-py's send or read was used")

    monkeypatch.setattr(conn, "send_packed_command", refused)
    monkeypatch.setattr(conn, "read_response", refused)
    t = q.enqueue("h", model="A", vram_gb=1)
    assert q.record(t.id).state is State.QUEUED
    got = exchange(q.redis, [("SET", "x", "1"), ("HGET", "x", "f"), ("GET", "x")], retry=True)
    assert got[0] == "OK" and isinstance(got[1], redis.ResponseError) and got[2] == "1"
    monkeypatch.undo()
    killer = redis.Redis(host=conn.host, port=conn.port)
    killer.client_kill_filter(_type="normal", skipme=True)
    killer.close()
    assert exchange(q.redis, [("GET", "x")], retry=True) == ["1"]  # reconnected, no retry spent


def test_a_call_while_the_kept_connection_is_busy_takes_one_from_the_pool(
        real_queue: Queue) -> None:
    """A result wait blocks on the client's kept connection; another thread's calls meanwhile
    go over a pooled one, and the wait still sees the result."""
    q = real_queue
    waited = q.enqueue("h", model="A", vram_gb=1)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(waited.result(timeout=10)))
    waiter.start()
    time.sleep(0.2)  # the waiter blocks in its pop, on the kept connection
    other = q.enqueue("h", model="B", vram_gb=1)
    c = claim(q, "w1", 40)
    assert c is not None and c["id"] == waited.id
    ack(q, waited.id, c["token"], {"ok": 1})
    waiter.join(10)
    assert got == [{"ok": 1}]
    assert q.record(other.id).state is State.QUEUED


def test_a_forked_child_does_not_use_its_parents_kept_connection(real_queue: Queue) -> None:
    q = real_queue
    q.enqueue("h", model="A", vram_gb=1)
    parents = kept_connection(q.redis)
    pid = os.fork()
    if pid == 0:  # the child: its own connection, replies in step
        ok = q.enqueue("h", model="A", vram_gb=1).status() is State.QUEUED
        os._exit(0 if ok and kept_connection(q.redis) is not parents else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert kept_connection(q.redis) is parents
    assert q.enqueue("h", model="A", vram_gb=1).status() is State.QUEUED
    assert q.redis.zcard(q.keys.queue(2, "A")) == 3


def test_a_chunk_rejected_by_the_server_is_not_written_and_the_stream_stays_in_step(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal the bulk's preflight did not foresee (gpuq.bulk: the pool changed between
    its check and the calls), here check_fit's handlers with the preflight's look skipped."""
    monkeypatch.setattr(bulk.Fits, "check", lambda self, i, s: None)
    register_worker(queue, "w1")
    batch = [task(payload={"i": i}, task_id=f"b{i}") for i in range(450)]
    batch[250]["handler"] = "unknown"  # the second chunk of 200
    with pytest.raises(PartialEnqueue, match="250 of 450 tasks were enqueued") as caught:
        queue.enqueue_many(batch, check_fit=True)
    # the first and third chunks are written, the second not at all, and said so
    assert queue.redis.zcard(queue.keys.queue(2, "A")) == 200 + 50
    assert {t.id for t in caught.value.enqueued} == {b["task_id"] for b in batch[:200] + batch[400:]}
    assert len(queue.enqueue_many([task() for _ in range(3)])) == 3  # the connection is in step


@pytest.mark.parametrize("bad", [7, 250])
@pytest.mark.parametrize("unfit", [{"handler": "unknown"}, {"vram_gb": 100}, {"gpus": 4, "vram_gb": 8}])
def test_a_bulk_with_an_unfit_task_in_any_chunk_writes_nothing_and_names_it(
        queue: Queue, bad: int, unfit: dict[str, Any]) -> None:
    """Found by a QA pass: with check_fit, a bulk of 450 whose task 7 asked 100 GB (the
    largest class offers 75) stored tasks 200-449 (the later chunks' calls, streamed before
    the first's refusal was read) and said "250 of 450 tasks were enqueued ... the rest
    not". The preflight reads the classes and handlers: nothing is written, and the refusal
    says which task, as the scripts' refusals of a bulk now do."""
    register_worker(queue, "w1")
    batch = [task(payload={"i": i}) for i in range(450)]
    batch[bad].update(unfit)
    with pytest.raises(Unschedulable, match=f"^unschedulable: task {bad} of the batch: "):
        queue.enqueue_many(batch, check_fit=True)
    assert queue.redis.zcard(queue.keys.queue(2, "A")) == 0
    with pytest.raises(Unschedulable, match="^unschedulable: task 1 of the batch: "):
        queue.enqueue_many(batch[bad - 1:bad + 1], check_fit=True)  # one call: the script's refusal
    assert queue.redis.zcard(queue.keys.queue(2, "A")) == 0


def test_a_bulk_preflight_reads_damaged_classes_as_the_script_does(queue: Queue) -> None:
    """Found by a review: a class's GB of "nan" or GPUs of "inf" made the preflight raise a
    bare ValueError/OverflowError, and it read other damaged values unlike enqueue.lua."""
    register_worker(queue, "w1")  # A100: 75 GB usable
    queue.redis.hset(queue.keys.classes, mapping={"bad": "nan", "worse": "inf"})
    queue.redis.hset(queue.keys.class_gpus, mapping={"A100": "zz", "worse": "inf"})
    for n in (2, 450):  # one script call; a bulk of several calls (the preflight)
        batch = [task(vram_gb=70) for _ in range(n)]
        batch[1]["vram_gb"] = 100
        with pytest.raises(Unschedulable, match="task 1 of the batch: task needs 100 GB of VRAM, the "
                                                "largest registered GPU class offers 75 GB"):
            queue.enqueue_many(batch, check_fit=True)
    assert queue.redis.zcard(queue.keys.queue(2, "A")) == 0


def test_duplicate_task_id_is_rejected_and_nothing_overwritten(queue: Queue) -> None:
    queue.enqueue("first", {"v": 1}, model="A", vram_gb=1, task_id="job-1")
    with pytest.raises(DuplicateTask) as err:
        queue.enqueue("second", {"v": 2}, model="B", vram_gb=2, priority="P0", task_id="job-1")
    assert err.value.task_id == "job-1"
    r = queue.record("job-1")
    assert (r.handler, r.payload, r.model, r.priority) == ("first", {"v": 1}, "A", Priority.P2)
    assert queue.redis.zcard(queue.keys.queue(0, "B")) == 0


@pytest.mark.parametrize("tenants", [False, True])
@pytest.mark.parametrize("idle", [False, True])
@pytest.mark.parametrize("taken", [None, 0, 1])  # None: new ids; else where the taken one is
def test_enqueue_tells_tenants_a_taken_id_and_an_idle_worker_apart(
        queue: Queue, tenants: bool, idle: bool, taken: int | None) -> None:
    """Enqueue counts the tenants hash, the first task's hash and the idle set in one EXISTS:
    whatever mix of them is there, each is told apart."""
    if tenants:
        set_tenant(queue, Tenant("a"))
    enqueue(queue, T0, task_id="old", model="x", vram_gb=100)  # fits no worker here
    if idle:
        assert claim(queue, "w1", 80, now_ms=T0) is None
    ids = ["new1", "new2"]
    if taken is not None:
        ids[taken] = "old"
    specs = [spec(task_id=t, model="m", tenant="a", priority="P1") for t in ids]
    if taken is not None:
        before = queue.redis.hgetall(queue.keys.task("old"))
        with pytest.raises(DuplicateTask) as err:
            queue.scripts.run(queue.calls.enqueue(specs, now_ms=T0 + 1))
        assert err.value.task_id == "old"
        assert queue.redis.hgetall(queue.keys.task("old")) == before
        assert not queue.redis.exists(queue.keys.task("new1"), queue.keys.task("new2"))
        return
    queue.scripts.run(queue.calls.enqueue(specs[:1], now_ms=T0 + 1))
    fields = queue.redis.hgetall(queue.keys.task("new1"))
    assert ("fair" in fields) == tenants  # queued in its tenant's fair order
    assert fields.get("offered") == ("w1" if idle else None)  # offered to the idle worker
    queue.scripts.run(queue.calls.enqueue(specs[1:], now_ms=T0 + 1))
    assert queue.redis.hget(queue.keys.task("new2"), "state") == "queued"


def test_check_fit_without_any_registered_class_is_unschedulable(queue: Queue) -> None:
    with pytest.raises(Unschedulable) as err:
        queue.enqueue("h", model="A", vram_gb=8, check_fit=True)
    assert (err.value.vram_gb, err.value.largest_gb) == (8, 0)
    assert pool_keys(queue) == set()


def test_check_fit_with_a_class_too_small_is_unschedulable(queue: Queue) -> None:
    queue.redis.hset(queue.keys.classes, "A10", 19)
    with pytest.raises(Unschedulable) as err:
        queue.enqueue("h", model="A", vram_gb=40, check_fit=True)
    assert (err.value.vram_gb, err.value.largest_gb) == (40, 19)
    assert pool_keys(queue) == {queue.keys.classes}
    queue.redis.hset(queue.keys.classes, "H100", 75)
    queue.redis.sadd(queue.keys.handlers, "h")
    t = queue.enqueue("h", model="A", vram_gb=40, check_fit=True)
    assert t.status() is State.QUEUED


def test_check_fit_refuses_a_handler_no_worker_registered(queue: Queue) -> None:
    """A producer's typo is refused at the boundary, like a task no GPU class fits; each
    task of a bulk call is checked."""
    queue.redis.hset(queue.keys.classes, "L4", 19)
    queue.redis.sadd(queue.keys.handlers, "sim.run")
    with pytest.raises(UnregisteredHandler, match="registers handler 'nope.x'") as err:
        queue.enqueue_many([{"handler": "sim.run", "model": "A", "vram_gb": 4},
                            {"handler": "nope.x", "model": "A", "vram_gb": 4}], check_fit=True)
    assert isinstance(err.value, Unschedulable) and err.value.handler == "nope.x"
    assert pool_keys(queue) == {queue.keys.classes, queue.keys.handlers}
    assert queue.enqueue("nope.x", model="A", vram_gb=4).status() is State.QUEUED  # unchecked


@pytest.mark.parametrize("field, raw", [
    ("payload", "{bad json"), ("payload", "[1,"), ("payload", ""),
    ("priority", "9"), ("priority", "P0"), ("priority", ""),
    ("vram_gb", "-8"), ("vram_gb", "abc"), ("vram_gb", "0"), ("vram_gb", "nan"),
    ("vram_gb", "inf"), ("vram_gb", ""),
    ("id", "has spaces"), ("id", "a{b}"), ("id", ""), ("model", "a,b"), ("handler", "x y"),
    ("tenant", ""), ("est_s", "-1"), ("est_s", "soon"), ("deadline", "-5"),
    ("deadline", "tomorrow"), ("preemptible", "yes"), ("max_attempts", "0"),
    ("max_attempts", "1.5"), ("max_attempts", "101"), ("max_attempts", "many"),
])
def test_bad_raw_input_is_rejected_by_the_enqueue_script(queue: Queue, field: str,
                                                         raw: str) -> None:
    _, call = raw_enqueue_call(queue, **{field: raw})
    with pytest.raises(InvalidTask):
        queue.scripts.run(call)
    assert pool_keys(queue) == set()


@pytest.mark.parametrize("field, raw", [
    ("id", "a\tb"), ("id", "x" * 201), ("handler", "a,b"), ("handler", "x" * 201),
    ("model", "m\nx"), ("model", "{m}"), ("tenant", "t}"), ("tenant", "t u"), ("tenant", "x" * 201),
    # control characters would reach key names, logs and terminals as they are
    ("model", "m\x01"), ("model", "a\x00b"), ("handler", "h\x1b[31m"), ("tenant", "t\x7f"),
])
def test_a_bad_name_is_rejected_with_its_field_named(queue: Queue, field: str, raw: str) -> None:
    _, call = raw_enqueue_call(queue, **{field: raw})
    with pytest.raises(InvalidTask, match=f": {field} must be a non-empty name"):
        queue.scripts.run(call)
    assert pool_keys(queue) == set()


def test_a_bad_name_later_in_a_bulk_call_rejects_the_call(queue: Queue) -> None:
    """The script checks a call's repeated handler, model and tenant once: a later task with
    other names is still checked, and the id of every task."""
    for field, raw in (("model", "b c"), ("id", "x,y")):
        call = queue.calls.enqueue([spec(), spec(), spec()], now_ms=T0)
        args = list(call.args)
        args[ENQUEUE_HEAD + 2 * len(ENQUEUE_FIELDS) + ENQUEUE_FIELDS.index(field)] = raw
        with pytest.raises(InvalidTask, match=f": {field} must be"):
            queue.scripts.run(Call(call.script, args, call.parse))
        assert pool_keys(queue) == set()


def test_names_checked_once_per_call_cannot_be_confused_across_tasks(queue: Queue) -> None:
    """Regression: the once-per-call check keyed (handler, model, tenant) by joining them with
    '|', a legal name character, so ("a", "|", "d") then ("a|", "", "d") shared a key and the
    second task's empty model was stored. A producer in another language relies on the script."""
    call = queue.calls.enqueue([spec(), spec()], now_ms=T0)
    args = list(call.args)
    for index, (handler, model) in enumerate((("a", "|"), ("a|", ""))):
        base = ENQUEUE_HEAD + index * len(ENQUEUE_FIELDS)
        args[base + ENQUEUE_FIELDS.index("handler")] = handler
        args[base + ENQUEUE_FIELDS.index("model")] = model
        args[base + ENQUEUE_FIELDS.index("tenant")] = "d"
    with pytest.raises(InvalidTask, match=": model must be a non-empty name"):
        queue.scripts.run(Call(call.script, args, call.parse))
    assert pool_keys(queue) == set()


def test_wrong_argument_count_is_invalid(queue: Queue) -> None:
    _, call = raw_enqueue_call(queue)
    with pytest.raises(InvalidTask, match="groups of 16"):
        queue.scripts.run(type(call)(call.script, call.args[:-1], call.parse))
    assert pool_keys(queue) == set()


def test_a_task_enqueued_with_report_end_is_listed_when_it_ends_unsucceeded(queue: Queue) -> None:
    listed, quiet = enqueue(queue, T0, report_end=True), enqueue(queue, T0)
    assert queue.redis.hget(queue.keys.task(listed), "report_end") == "1"
    assert queue.redis.hget(queue.keys.task(quiet), "report_end") is None  # written when asked
    for task_id in (listed, quiet):
        queue.scripts.run(queue.calls.cancel(task_id, now_ms=T0 + 1))
    succeeded = enqueue(queue, T0 + 2, report_end=True)
    task = claim(queue, "w1", 80, now_ms=T0 + 3)
    assert task is not None and task["id"] == succeeded
    ack(queue, succeeded, task["token"], now_ms=T0 + 4)
    assert queue.redis.lrange(queue.keys.ended, 0, -1) == [listed]


# Regression: the script once accepted values the Python reader could not read back, so a
# foreign client's task broke record()/result() instead of being rejected as INVALID:
#   max_attempts "2.0" / "1e1" passed `attempts == math.floor(attempts)` but were stored raw
#     (TaskRecord.from_fields does int());
#   deadline "inf" / "1e400" passed `> 0` and ms(inf) stored "-9223372036854775808";
#   payload "nan" / "0x10" / "-inf": Redis's cjson decodes invalid numbers, Python's json
#     does not (fakeredis's cjson always rejected them).
@pytest.mark.parametrize("field, raw", [
    ("max_attempts", "2.0"), ("max_attempts", "1e1"), ("deadline", "inf"),
    ("deadline", "1e400"), ("payload", "nan"), ("payload", "0x10"), ("payload", "-inf"),
])
def test_the_script_accepts_only_what_the_reader_can_read(queue: Queue, field: str,
                                                          raw: str) -> None:
    tid, call = raw_enqueue_call(queue, **{field: raw})
    try:
        queue.scripts.run(call)
    except InvalidTask:
        assert pool_keys(queue) == set()
        return
    r = queue.record(tid)  # must not raise
    assert r.deadline is None or r.deadline > r.enqueued_at


def record_loads(q: Queue, model: str, *seconds: float) -> None:
    pipe = q.redis.pipeline(transaction=False)
    for s in seconds:
        catalog.record_load(pipe, q.keys, model, 1, s)
    pipe.execute()


def test_a_cold_claim_notes_when_its_model_should_be_loaded(queue: Queue) -> None:
    record_loads(queue, "A", 2.0, 4.0)  # the catalog's mean: 3 s
    cold, warm, unknown = (enqueue(queue, T0, model=m) for m in ("A", "A", "B"))
    c = claim(queue, "w1", 40, now_ms=T0 + 10)
    assert c is not None and c["id"] == cold
    assert queue.redis.hget(queue.keys.task(cold), "ready_at") == str(T0 + 10 + 3000)
    c = claim(queue, "w2", 40, loaded=[("A", 1)], now_ms=T0 + 20)  # held: no load
    assert c is not None and c["id"] == warm
    c = claim(queue, "w3", 40, now_ms=T0 + 30)  # never loaded in this pool: no estimate
    assert c is not None and c["id"] == unknown
    assert queue.redis.hmget(queue.keys.task(warm), "ready_at", "loading") == [None, None]
    assert queue.redis.hmget(queue.keys.task(unknown), "ready_at", "loading") == [None, "1"]
    assert queue.redis.hget(queue.keys.task(cold), "loading") == "1"
    queue.requeue(cold)  # its next start may be warm: the estimate goes with this one
    assert queue.redis.hmget(queue.keys.task(cold), "ready_at", "loading") == ["", ""]


def test_the_planner_counts_a_cold_victims_runtime_from_its_models_load(queue: Queue) -> None:
    """A victim asked to yield while its model loads would yield after the load, throwing it
    away: its runtime (preempt_min_runtime_s) and end count from the load's expected end."""
    record_loads(queue, "batch", 20.0)
    now = int(time.time() * 1000)
    queue.redis.hset(queue.keys.worker("w1"), mapping={"vram_total_gb": 80, "kv_reserve_gb": 5})
    queue.redis.zadd(queue.keys.workers, {"w1": now + 60_000})
    victim = enqueue(queue, now - 5_000, model="batch", vram_gb=30, priority="P3", est_s=100)
    assert claim(queue, "w1", 75, slots=2, now_ms=now - 5_000) is not None  # loading for 20 s
    planner = Preemptor(queue.redis, queue.keys, queue.config, queue.scripts, queue.calls)
    (v,) = planner.read_workers(now)[0]
    assert v.id == victim and v.started_ms == now - 5_000 + 20_000
    assert v.ends_ms == now + 115_000
    assert not may_be_asked(v, queue.config, now)


@pytest.mark.parametrize("mean_load_s", [3.0, None])
def test_a_victim_still_loading_counts_from_now_until_its_handler_starts(
        queue: Queue, mean_load_s: float | None) -> None:
    """A load may outlast the catalog's mean, and a model's first load in the pool has none:
    until the worker reports its handler's start (began.lua), the victim's work counts from
    no sooner than now, so it is not asked to yield (its load would be thrown away); from
    then, from that report. Found in the demo: loading 70B victims were asked to yield."""
    if mean_load_s:
        record_loads(queue, "batch", mean_load_s)
    now = int(time.time() * 1000)
    queue.redis.hset(queue.keys.worker("w1"), mapping={"vram_total_gb": 80, "kv_reserve_gb": 5})
    queue.redis.zadd(queue.keys.workers, {"w1": now + 60_000})
    victim = enqueue(queue, now - 20_000, model="batch", vram_gb=30, priority="P3", est_s=100)
    c = claim(queue, "w1", 75, now_ms=now - 20_000)  # 20 s into its load
    assert c is not None and c["sla"] == "pending"
    planner = Preemptor(queue.redis, queue.keys, queue.config, queue.scripts, queue.calls)
    (v,) = planner.read_workers(now)[0]
    assert v.id == victim and v.started_ms == now and v.ends_ms == now + 100_000
    assert not may_be_asked(v, queue.config, now)
    assert queue.scripts.run(queue.calls.began(victim, int(c["token"]), now_ms=now - 4_000))[0]
    (v,) = planner.read_workers(now)[0]
    assert v.started_ms == now - 4_000 and may_be_asked(v, queue.config, now)
    assert queue.redis.hmget(queue.keys.task(victim), "loading", "ready_at") == ["", str(now - 4_000)]


@pytest.mark.parametrize("deadline_s", [None, 10.0])
def test_a_p0_behind_a_young_victim_has_it_yield_once_of_age(queue: Queue, deadline_s: float | None) -> None:
    """Found by an operator: a P0 task enqueued 0.3 s after a 25 s P3 task started was
    reserved behind it (too young to ask, its end within max_wait_s) and started 24.7 s
    later, or with a 10 s deadline expired waiting. The planner waits for the victim to
    come of age, then asks it to yield; the deadline is read as the task's latest start."""
    now = int(time.time() * 1000)
    queue.redis.hset(queue.keys.worker("w1"), mapping={"vram_total_gb": 80, "kv_reserve_gb": 5})
    queue.redis.zadd(queue.keys.workers, {"w1": now + 60_000})
    victim = enqueue(queue, now - 300, model="m", vram_gb=8, priority="P3", est_s=25)
    assert claim(queue, "w1", 75, loaded=[("m", 0)], now_ms=now - 300) is not None
    p0 = enqueue(queue, now, model="m", vram_gb=8, priority="P0", est_s=1, deadline_s=deadline_s)
    planner = Preemptor(queue.redis, queue.keys, queue.config, queue.scripts, queue.calls)
    (w,), _ = planner.read_waiting(now, workers=["w1"])
    assert w.id == p0 and w.latest_ms == (None if deadline_s is None else now + 9_000)
    assert planner.step(now) == {}  # not reserved for its end 24.7 s away
    of_age = planner.quiet_until
    assert of_age == now - 300 + int(queue.config.preempt_min_runtime_s * 1000)
    assert planner.step(of_age) == {"yield": 1}
    assert queue.redis.hget(queue.keys.task(victim), "yield_by") is not None


def test_the_planner_weighs_what_a_victims_neighbours_keep(queue: Queue) -> None:
    """Regression: on a two-slot worker the planner took the worker's whole usable VRAM as
    the room a victim's end leaves, and asked a 10 GB task to yield for a 40 GB P0 while a
    non-preemptible 60 GB neighbour kept all but 15 GB: a lost run and a blocked worker."""
    now = int(time.time() * 1000)
    queue.redis.hset(queue.keys.worker("w1"), mapping={"vram_total_gb": 80, "kv_reserve_gb": 5})
    queue.redis.zadd(queue.keys.workers, {"w1": now + 60_000})
    big = enqueue(queue, now - 60_000, model="B", vram_gb=60, priority="P3", est_s=600,
                  preemptible=False)
    small = enqueue(queue, now - 60_000, model="B", vram_gb=10, priority="P3", est_s=600)
    for tid, free in ((big, 75), (small, 15)):
        c = claim(queue, "w1", free, slots=2, loaded=[("B", 0)], now_ms=now - 60_000)
        assert c is not None and c["id"] == tid
    planner = Preemptor(queue.redis, queue.keys, queue.config, queue.scripts, queue.calls)
    (v,) = planner.read_workers(now)[0]
    assert v.id == small and v.room_gb == 15  # 75 usable less the neighbour's 60
    enqueue(queue, now, model="A", vram_gb=40, priority="P0", est_s=5)
    assert planner.step(now) == {}
    assert queue.redis.hget(queue.keys.task(small), "yield_by") is None
    enqueue(queue, now, model="A", vram_gb=12, priority="P0", est_s=5)  # fits once it ends
    assert planner.step(now) == {"yield": 1}


def test_a_claim_reads_at_most_sixteen_busy_holders_of_a_model(make_queue: MakeQueue) -> None:
    """Bounded work: the busy holders are read in name order, the first 16 of them; a large
    enough one past those is not waited for (docs/DECISIONS.md, Bounded work)."""
    q = make_queue(defer_s=2.0, holder_wait_s=120.0)
    for i in range(16):
        hold_model(q, f"h{i:02d}", "A", 24)  # busy, too small for the task
    hold_model(q, "h16", "A", 80)  # would take it, 17th by name
    tid = enqueue(q, T0, model="A", vram_gb=30, priority="P2")
    c = claim(q, "cold", 75, now_ms=T0 + 3000)  # past the defer bound: taken here, cold
    assert c is not None and c["id"] == tid
    q.redis.srem(q.keys.holders("A"), "h00")  # the large one is now among the first 16
    other = enqueue(q, T0, model="A", vram_gb=30, priority="P2")
    r = claim_reply(q, "cold2", 75, now_ms=T0 + 3000)
    assert r.task is None and r.retry_s > 100  # it waits for that holder
    assert q.record(other).state is State.QUEUED


def test_the_tightest_idle_holder_with_room_is_offered_the_task(queue: Queue) -> None:
    """idle_holder reads the idle holders in one call; the one with the least claimable VRAM
    (its idle score) that has room wins, ties by name. Found by a QA pass: the first by name
    won, so a one-GPU task went to an idle two-GPU group ("g2" < "s1") holding its model
    while a one-GPU holder idled, and a task only the group could run waited behind it."""
    for name, score in (("w3", 40), ("w1", 60), ("w2", 10), ("w4", 40)):
        queue.redis.zadd(queue.keys.idle, {name: score})
        queue.redis.sadd(queue.keys.holders("A"), name)
    queue.redis.zadd(queue.keys.idle, {"w0": 30})  # idle, not a holder
    tid = enqueue(queue, T0, model="A", vram_gb=30)
    assert queue.redis.hget(queue.keys.task(tid), "offered") == "w3"


def test_a_busy_models_task_may_evict_the_workers_idle_models(queue: Queue) -> None:
    """A model a running task uses is not in the evictable VRAM: the room for another task
    of it is free VRAM plus every idle model, its own footprint not taken off again."""
    tid = enqueue(queue, T0, model="A", vram_gb=45)  # 25 GB of working memory beside A's 20
    loaded = (("A", 20.0), ("B", 30.0))
    idle_a = ClaimRequest("w", 10, 30, 2, loaded)  # A counted idle: 10 + (30 - 20) < 25
    assert queue.scripts.run(queue.calls.claim(idle_a, now_ms=T0 + 1)).task is None
    busy_a = ClaimRequest("w", 10, 30, 2, loaded, in_use=frozenset({"A"}))  # 10 + 30 >= 25
    assert busy_a.fits("A", 45)
    got = queue.scripts.run(queue.calls.claim(busy_a, now_ms=T0 + 2)).task
    assert got is not None and got["id"] == tid


def test_a_claim_looks_at_the_64_oldest_models_of_a_level(queue: Queue) -> None:
    """Bounded work: 64 models' heads a level (their oldest first), then the claim stops."""
    for i in range(65):  # too large for the claimer, oldest first
        enqueue(queue, T0 + i, model=f"big{i:02d}", vram_gb=70)
    small = enqueue(queue, T0 + 100, model="small", vram_gb=10)  # the 66th model by head
    assert claim(queue, "w", 20, now_ms=T0 + 200) is None
    queue.redis.zrem(queue.keys.models_with_work, member(2, "big00"), member(2, "big01"))  # now 64th
    c = claim(queue, "w", 20, now_ms=T0 + 300)
    assert c is not None and c["id"] == small
