"""Contract suite: the claim's gates (lib/gates.lua) in the `fair` hash.

A claim reads the gates with the fairness counters and skips what they say holds nothing for
it: the delayed set before its first due time, the hand-overs before their first pickup
deadline, the tenants while there are none, the worker's reservation once every reservation
has expired. Each test runs on fakeredis and on the real server.
"""

from __future__ import annotations

from helpers import T0, ack, claim, claim_reply, enqueue, fail, reap
from test_contract_handover import register

from gpuq import Queue
from gpuq.task import State
from gpuq.tenants import Tenant, remove_tenant, require_registered, set_tenant


def gates(q: Queue) -> dict[str, str]:
    got = q.redis.hgetall(q.keys.fairness)
    return {k: v for k, v in got.items() if k not in ("1", "2", "3")}


def test_a_retry_moves_the_due_gate_and_a_claim_at_that_time_promotes_it(queue: Queue) -> None:
    q = queue
    tid = enqueue(q, T0, model="A", vram_gb=10)
    c = claim(q, "w1", 40, now_ms=T0 + 1)
    assert c is not None
    assert fail(q, tid, c["token"], "oom", now_ms=T0 + 10) == "delayed"
    due = int(q.redis.zscore(q.keys.delayed, tid))
    assert gates(q) == {"due_at": str(due)}
    assert claim(q, "w1", 40, now_ms=due - 1) is None  # not yet due
    c = claim(q, "w1", 40, now_ms=due)
    assert c is not None and c["id"] == tid and c["attempt"] == "2"
    assert gates(q) == {}  # the delayed set is empty: the gate goes with it


def test_a_claim_with_work_elsewhere_still_promotes_a_due_retry_first(queue: Queue) -> None:
    """The gate, not an empty queue, decides when the delayed set is read: a due P0 retry
    goes before queued P2 work."""
    q = queue
    tid = enqueue(q, T0, model="A", vram_gb=10, priority="P0")
    c = claim(q, "w1", 40, now_ms=T0 + 1)
    assert c is not None
    fail(q, tid, c["token"], "oom", now_ms=T0 + 2)
    due = int(q.redis.zscore(q.keys.delayed, tid))
    enqueue(q, due - 5, model="A", vram_gb=10, priority="P2")
    c = claim(q, "w1", 40, loaded=[("A", 10)], now_ms=due)
    assert c is not None and c["id"] == tid


def test_a_gate_left_behind_by_a_removal_is_set_again_by_the_next_claim(queue: Queue) -> None:
    q = queue
    first = enqueue(q, T0, model="A", vram_gb=10)
    second = enqueue(q, T0, model="A", vram_gb=10)
    leases = [claim(q, "w1", 40, slots=2, now_ms=T0 + 1), claim(q, "w1", 40, now_ms=T0 + 1)]
    assert all(c is not None for c in leases)
    by_id = {c["id"]: c for c in leases if c is not None}
    fail(q, first, by_id[first]["token"], "oom", now_ms=T0 + 10)  # due T0 + 1,010
    fail(q, second, by_id[second]["token"], "oom", now_ms=T0 + 500)  # due T0 + 1,500
    assert gates(q) == {"due_at": str(T0 + 1_010)}
    assert q.cancel(first) == "delayed"  # leaves the set; the gate stays behind
    assert gates(q) == {"due_at": str(T0 + 1_010)}
    assert claim(q, "w2", 40, now_ms=T0 + 1_100) is None  # looks, finds the next due later
    assert gates(q) == {"due_at": str(T0 + 1_500)}
    c = claim(q, "w2", 40, now_ms=T0 + 1_500)
    assert c is not None and c["id"] == second


def test_a_hand_over_moves_the_pickup_gate(queue: Queue) -> None:
    q = queue
    register(q, "w1")
    tid = enqueue(q, T0 + 10, model="m", vram_gb=4, priority="P0")
    deadline = int(q.redis.zscore(q.keys.handed, tid))
    assert gates(q) == {"pickup_at": str(deadline)}
    # a claim that takes work before the deadline leaves the hand-over alone
    other = enqueue(q, T0 + 11, model="n", vram_gb=4)
    c = claim(q, "w2", 40, now_ms=deadline - 1)
    assert c is not None and c["id"] == other
    assert q.redis.zscore(q.keys.handed, tid) == deadline
    # one at the deadline takes the unread hand-over back, and may run it itself
    c = claim(q, "w2", 40, now_ms=deadline)
    assert c is not None and c["id"] == tid
    assert q.redis.lrange(q.keys.wake("w1"), 0, -1) == []
    assert gates(q) == {}


def test_an_idle_claim_looks_again_at_an_unread_hand_overs_deadline(queue: Queue) -> None:
    q = queue
    register(q, "w1")
    tid = enqueue(q, T0 + 10, model="m", vram_gb=4, priority="P0")
    deadline = int(q.redis.zscore(q.keys.handed, tid))
    r = claim_reply(q, "w2", 40, now_ms=T0 + 20)
    # the deadline, rounded up to the lookout's step (lib/lookout.lua)
    assert r.task is None and (deadline - (T0 + 20)) / 1000 < r.retry_s <= 0.2


def test_the_tenancy_gate_follows_the_tenants_hash(queue: Queue) -> None:
    q = queue
    assert "tenancy" not in gates(q)
    set_tenant(q, Tenant("a"))
    assert gates(q)["tenancy"] == "1"
    remove_tenant(q, "a")
    assert "tenancy" not in gates(q)
    require_registered(q, True)  # the policy alone keeps the hash, and tenancy, on
    assert gates(q)["tenancy"] == "1"
    require_registered(q, False)
    assert "tenancy" not in gates(q)


def test_a_reservation_moves_the_reserved_gate(queue: Queue) -> None:
    q = queue
    victim = enqueue(q, T0, model="B", vram_gb=10, priority="P3")
    c = claim(q, "w1", 75, now_ms=T0)
    assert c is not None
    q.redis.zadd(q.keys.workers, {"w1": T0 + 10**9})  # live
    waiting = enqueue(q, T0 + 1, model="A", vram_gb=60, priority="P0")
    assert q.scripts.run(q.calls.preempt(waiting, "w1", victim, int(c["token"]), reserve_ms=1000,
                                         grace_ms=None, now_ms=T0 + 10)) == ("reserved", "")
    assert gates(q) == {"reserved_until": str(T0 + 1_010)}
    ack(q, victim, c["token"], now_ms=T0 + 20)
    c = claim(q, "w1", 75, now_ms=T0 + 30)
    assert c is not None and c["id"] == waiting


def test_what_an_older_release_adds_without_gates_is_seen_after_a_reaper_round(
        queue: Queue) -> None:
    """A client of a release before the gates writes the delayed set, hand-overs and tenants
    alone: claims skip them until the reaper's next round sets the gates."""
    q = queue
    enqueue(q, T0, model="A", vram_gb=10)
    tid = enqueue(q, T0, model="A", vram_gb=10)
    c1, c2 = claim(q, "w1", 40, slots=2, now_ms=T0 + 1), claim(q, "w1", 40, now_ms=T0 + 1)
    assert c1 is not None and c2 is not None
    c = c1 if c1["id"] == tid else c2
    q.redis.hset(q.keys.task(tid), mapping={"state": State.DELAYED.value, "worker": "", "token": ""})
    q.redis.zrem(q.keys.running, tid)
    q.redis.srem(q.keys.worker_tasks("w1"), tid)
    q.redis.zadd(q.keys.delayed, {tid: T0 + 5_000})  # as an older fail.lua does, no gate
    q.redis.hset(q.keys.tenants, "a", "1 - -")
    assert gates(q) == {} and c is not None
    reap(q, now_ms=T0 + 100)
    assert gates(q) == {"due_at": str(T0 + 5_000), "tenancy": "1"}
    c = claim(q, "w2", 40, now_ms=T0 + 5_000)
    assert c is not None and c["id"] == tid
