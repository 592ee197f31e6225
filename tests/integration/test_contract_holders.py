"""Contract suite: a model's busy holders as claims and enqueues weigh them (lib/holders.lua).

Runs on fakeredis and on the real server (``backend``). A live worker's capacity (usable
VRAM, GPUs, levels) is listed in ``capacities`` from its registration to its departure
(leave, retire, reap), and a busy holder is weighed by that entry; one with no entry (a
worker registered by an older gpuq) by its hash. The holder wait reads the holders' tasks
only until one frees up soon enough, and decides as if it had read them all.
"""

from __future__ import annotations

from conftest import MakeQueue
from helpers import T0, claim, claim_reply, enqueue, heartbeat, reap, register_worker

from gpuq import Queue, State
from gpuq.worker.presence import Presence


def capacity(q: Queue, wid: str) -> tuple[float, int, str] | None:
    entry = q.redis.hget(q.keys.capacities, wid)
    if entry is None:
        return None
    usable, gpus, levels = entry.split(" ")
    return float(usable), int(gpus), levels


def busy_holder(q: Queue, wid: str, model: str, device_gb: float = 80, ends_in_s: float = 100,
                now_ms: int = T0, levels: str = "0123") -> None:
    """A registered worker holding ``model``, running a task whose estimate ends it
    ``ends_in_s`` after now_ms."""
    register_worker(q, wid, device_gb=device_gb, holds=(model,), levels=levels)
    q.redis.hset(q.keys.task(f"running-on-{wid}"), mapping={"started_at": now_ms, "est_s": ends_in_s})


def serving(q: Queue) -> list[set[str]]:
    """Each level's `serving` set (lib/holders.lua)."""
    return [q.redis.smembers(q.keys.serving(level)) for level in range(4)]


def test_a_workers_capacity_is_listed_from_registration_to_departure(queue: Queue) -> None:
    """And so is each level it serves, in that level's `serving` set."""
    usable = register_worker(queue, "w1")
    group = register_worker(queue, "g1", device_gb=48, gpus=2, levels="01")
    register_worker(queue, "ret", idle=True)
    register_worker(queue, "dead")
    assert capacity(queue, "w1") == (usable, 1, "0123")
    assert capacity(queue, "g1") == (group, 2, "01")
    every = {"w1", "ret", "dead"}
    assert serving(queue) == [every | {"g1"}, every | {"g1"}, every, every]
    Presence(queue.redis, queue.keys, "w1").leave([])
    assert capacity(queue, "w1") is None
    for wid in ("g1", "ret", "dead"):
        heartbeat(queue, wid, [], now_ms=T0)
    queue.redis.hset(queue.keys.settings, "min_workers", 0)
    assert queue.scripts.run(queue.calls.retire("ret", now_ms=T0 + 1))[0]
    assert capacity(queue, "ret") is None
    heartbeat(queue, "g1", [], now_ms=T0 + 50_000)
    assert reap(queue, now_ms=T0 + 60_000).dead_workers == 1
    assert capacity(queue, "dead") is None and capacity(queue, "g1") == (group, 2, "01")
    assert serving(queue) == [{"g1"}, {"g1"}, set(), set()]


def test_a_busy_holder_is_weighed_by_its_listed_capacity(make_queue: MakeQueue) -> None:
    """A 24 GB holder cannot take a 30 GB task and is not waited for; an 80 GB one is, by
    its `capacities` entry alone (its hash's VRAM fields are not read)."""
    q = make_queue(defer_s=2.0, holder_wait_s=120.0)
    busy_holder(q, "small", "A", device_gb=24, ends_in_s=5)
    first = enqueue(q, T0, model="A", vram_gb=30, priority="P2")
    c = claim(q, "cold", 75, now_ms=T0 + 3000)
    assert c is not None and c["id"] == first
    busy_holder(q, "big", "A", ends_in_s=5)
    q.redis.hdel(q.keys.worker("big"), "vram_total_gb", "kv_reserve_gb")
    second = enqueue(q, T0, model="A", vram_gb=30, priority="P2")
    r = claim_reply(q, "cold2", 75, now_ms=T0 + 3000)
    assert r.task is None and r.retry_s > 100
    assert q.record(second).state is State.QUEUED


def test_a_holder_not_listed_is_weighed_by_its_hash(make_queue: MakeQueue) -> None:
    """A worker registered before `capacities` existed is still waited for."""
    q = make_queue(defer_s=2.0, holder_wait_s=120.0)
    busy_holder(q, "old", "A", ends_in_s=5)
    q.redis.hdel(q.keys.capacities, "old")
    enqueue(q, T0, model="A", vram_gb=30, priority="P2")
    r = claim_reply(q, "cold", 75, now_ms=T0 + 3000)
    assert r.task is None and r.retry_s > 100
    q.redis.hset(q.keys.worker("old"), "vram_total_gb", 24)  # too small now
    c = claim(q, "cold2", 75, now_ms=T0 + 3000)
    assert c is not None


def test_the_holder_wait_is_decided_by_the_soonest_of_all_holders_tasks(make_queue: MakeQueue) -> None:
    """Whatever order the holders' tasks are read in, the task waits when any holder frees up
    within what is left of its wait (20 s here), and only then."""
    q = make_queue(defer_s=2.0, holder_wait_s=120.0)
    for i, ends in enumerate((150, 140, 130, 110, 160)):  # one frees up 10 s after the claim
        busy_holder(q, f"h{i}", "A", ends_in_s=ends)
    tid = enqueue(q, T0, model="A", vram_gb=30, priority="P2")
    r = claim_reply(q, "cold", 75, now_ms=T0 + 100_000)
    assert r.task is None and 0 < r.retry_s <= 20
    q.redis.hset(q.keys.task("running-on-h3"), "est_s", 125)  # now 25 s: none within 20 s
    c = claim(q, "cold2", 75, now_ms=T0 + 100_000)
    assert c is not None and c["id"] == tid


def test_a_holder_with_a_free_slot_but_no_room_is_a_busy_holder(make_queue: MakeQueue) -> None:
    """A two-slot worker running a 70 GB task of model A stays in `idle` (a free slot) with
    5 GB to claim: a second 70 GB task of A waits for it, as for a holder out of `idle`,
    rather than load A on another GPU; it does not wait for a holder running nothing."""
    q = make_queue(defer_s=2.0, holder_wait_s=120.0)
    register_worker(q, "two", holds=("A",), idle=True)
    q.redis.srem(q.keys.holders("A"), "two")
    running = enqueue(q, T0, model="A", vram_gb=70, priority="P2", est_s=10)
    c = claim(q, "two", 75, slots=2, now_ms=T0)
    assert c is not None and c["id"] == running
    q.redis.sadd(q.keys.holders("A"), "two")
    assert q.redis.zscore(q.keys.idle, "two") == 5
    tid = enqueue(q, T0 + 1, model="A", vram_gb=70, priority="P2", est_s=10)
    r = claim_reply(q, "cold", 75, now_ms=T0 + 3000)  # past the defer bound: frees up in 7 s
    assert r.task is None and r.retry_s > 100
    assert q.record(tid).state is State.QUEUED
    q.redis.srem(q.keys.worker_tasks("two"), running)  # its task ended, its claim not yet made
    c = claim(q, "cold2", 75, now_ms=T0 + 3000)
    assert c is not None and c["id"] == tid
