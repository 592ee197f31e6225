"""The reaper's room for tenants' recent demand (gpuq.reaper.tenant_room) on a pool: the
work tenants enqueue sets the bounds it writes, which lift as the demand fades."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from conftest import MakeQueue
from helpers import RESERVE_GB, T0, claim, enqueue, enqueue_specs, heartbeat, spec

from gpuq import Queue, worker_record
from gpuq.keys import SLOTS
from gpuq.reaper.tenant_room import TenantRoom
from gpuq.tenants import Tenant, remove_tenant, set_tenant
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.presence import Presence


def room(q: Queue, half_life_s: float = 1.0) -> TenantRoom:
    config = replace(q.config, tenant_half_life_s=half_life_s)
    return TenantRoom(q.redis, q.keys, config, q.scripts, q.calls)


def bounds(q: Queue) -> dict[str, str]:
    return {k: v for k, v in q.redis.hgetall(q.keys.tenant_use).items() if k.startswith("bound:")}


def offer(q: Queue, tenant: str, tasks: int, now: int) -> None:
    enqueue_specs(q, [spec(model="m", tenant=tenant, est_s=4) for _ in range(tasks)], now_ms=now)


def test_a_flooding_tenant_leaves_room_for_the_others_demand_until_it_fades(queue: Queue) -> None:
    for i in range(8):
        heartbeat(queue, f"w{i}", [], now_ms=T0)
    set_tenant(queue, Tenant("a"))
    set_tenant(queue, Tenant("b"))
    r = room(queue)
    assert r.step(T0) == 0  # the first step reads the work totals
    offer(queue, "a", 30, T0 + 1)  # 120 s of work in a second
    assert r.step(T0 + 1000) == 0  # one tenant with demand borrows everything
    offer(queue, "a", 30, T0 + 1001)
    offer(queue, "b", 1, T0 + 1001)
    assert r.step(T0 + 2000) == 1
    # half-life 1 s: a (90 workers of demand) borrows beyond its share of 4; b (2) needs room
    # for 2 + sqrt(2): a is bound to 8 - 3.41, b is not
    assert bounds(queue) == {"bound:a": "4"}
    steps = 0
    while bounds(queue) and steps < 20:  # no more work: b's demand fades, then a's
        steps += 1
        r.step(T0 + 2000 + 1000 * steps)
    assert bounds(queue) == {} and 3 <= steps < 20
    assert queue.redis.hgetall(queue.keys.tenant_use) == {}  # neither counted any more


def test_no_tenants_no_room(queue: Queue) -> None:
    for i in range(4):
        heartbeat(queue, f"w{i}", [], now_ms=T0)
    set_tenant(queue, Tenant("a"))
    r = room(queue)
    r.step(T0)
    offer(queue, "a", 5, T0 + 1)
    offer(queue, "b", 5, T0 + 1)
    r.step(T0 + 1000)
    assert bounds(queue) == {"bound:a": "2", "bound:b": "2"}  # both borrow; b weighs 1 unregistered
    remove_tenant(queue, "a")  # tenancy ends: its counts go, and the reaper forgets
    assert r.step(T0 + 2000) == 0 and r.demand == {}


def test_an_unregistered_tenant_gone_quiet_is_forgotten(queue: Queue) -> None:
    """A pool that names a tenant per customer keeps no state for every name it has seen:
    once an unregistered tenant has had no task queued for a day, its work total, finish tags
    and SLA counts go; a registered tenant, and one with tasks queued, keep theirs."""
    heartbeat(queue, "w", [], now_ms=T0)
    set_tenant(queue, Tenant("a"))
    r = room(queue)
    offer(queue, "a", 1, T0)
    offer(queue, "cust1", 1, T0)
    offer(queue, "cust2", 1, T0)
    queue.redis.hset(queue.keys.stats, mapping={"sla_met:P2:cust1": 3, "sla_missed:P0:cust1": 1})
    for tid in queue.redis.zrange(queue.keys.queue(2, "m"), 0, -1):
        if queue.redis.hget(queue.keys.task(tid), "tenant") != "cust2":
            queue.scripts.run(queue.calls.cancel(tid, now_ms=T0 + 10))  # cust2's task stays queued
    day = 86_400_000
    r.step(T0 + 1000)
    r.step(T0 + day - 1000)  # a day has not passed since cust1's last task
    assert queue.redis.hexists(queue.keys.tenant_work, "cust1")
    r.step(T0 + day + 60_000)  # its finish tag (T0 + its 4 s spaced by its share) is past
    assert sorted(queue.redis.hkeys(queue.keys.tenant_work)) == ["a", "cust2"]
    assert not any(":cust1" in f for f in queue.redis.hkeys(queue.keys.tenant_clock))
    assert not any(f.endswith(":cust1") for f in queue.redis.hkeys(queue.keys.stats))
    assert "cust1" not in r.work
    # it comes back: its new work counts whole, as if it had never left
    offer(queue, "cust1", 2, T0 + day + 61_000)
    assert queue.redis.hget(queue.keys.tenant_work, "cust1") == "8"


def test_ending_tenancy_drops_the_per_tenant_sla_counts(queue: Queue) -> None:
    """The reaper forgets quiet tenants only while tenancy is on, so the last tenant's
    removal takes every tenant's SLA counts with it: a pool that turns tenancy on and off
    keeps none for the names it saw. The pool's own counts stay."""
    set_tenant(queue, Tenant("a"))
    for i, tenant in enumerate(("a", "cust1", "cust2")):
        enqueue(queue, T0 + i, priority="P1", model="m", tenant=tenant)
        got = claim(queue, f"w{i}", 100, loaded=[("m", 4.0)], now_ms=T0 + 10 + i)
        assert got is not None
    assert queue.redis.hget(queue.keys.stats, "sla_met:P1:cust1") == "1"
    remove_tenant(queue, "a")
    stats = queue.redis.hgetall(queue.keys.stats)
    assert stats["sla_met:P1"] == "3"
    assert [f for f in stats if f.startswith("sla_")] == ["sla_met:P1"]


def test_forget_keeps_a_tenant_whose_work_moved_since_it_was_read(queue: Queue) -> None:
    set_tenant(queue, Tenant("a"))
    offer(queue, "cust", 1, T0)
    tid = queue.redis.zrange(queue.keys.queue(2, "m"), 0, -1)[0]
    queue.scripts.run(queue.calls.cancel(tid, now_ms=T0 + 10))
    cutoff = str(T0 + 10_000)
    assert queue.scripts.run(queue.calls.tenant("forget", cutoff, "cust", "3")) == ""  # total is 4
    assert queue.scripts.run(queue.calls.tenant("forget", cutoff, "a", "")) == ""  # registered
    assert queue.scripts.run(queue.calls.tenant("forget", cutoff, "cust", "4")) == "cust"


def test_bounds_count_the_live_workers_slots_not_the_workers(queue: Queue) -> None:
    """Found by a QA pass: two workers of --concurrency 4 counted as 2, so a tenant flooding
    beside a light one was bound to 1 running task while 6 of the 8 slots idled."""
    for i in range(2):
        heartbeat(queue, f"w{i}", [], now_ms=T0)
        queue.redis.hset(queue.keys.worker(f"w{i}"), "concurrency", 4)
    set_tenant(queue, Tenant("a"))
    set_tenant(queue, Tenant("b"))
    r = room(queue)
    r.step(T0)
    offer(queue, "a", 30, T0 + 1)
    offer(queue, "b", 1, T0 + 1)
    assert r.step(T0 + 1000) == 1
    # 8 slots; b's demand 2 (4 s offered in a second) needs 2 + sqrt(2): a is bound to 4
    assert bounds(queue) == {"bound:a": "4"}


def test_the_slots_per_live_worker_are_published_while_tenancy_is_on(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    for i, slots in enumerate((1, 2, 3)):
        heartbeat(queue, f"w{i}", [], now_ms=T0)
        queue.redis.hset(queue.keys.worker(f"w{i}"), "concurrency", slots)
    r = room(queue)
    r.step(T0)
    # tenancy off: nothing published, nor by a call that raced the last tenant's removal
    assert queue.scripts.run(queue.calls.tenant("slots", "2")) == ""
    assert not queue.redis.exists(queue.keys.tenant_clock)
    set_tenant(queue, Tenant("a"))
    sent: list[tuple[str, ...]] = []
    tenant = queue.calls.tenant

    def spy(op: str, *args: str) -> Any:
        sent.append((op, *args))
        return tenant(op, *args)

    monkeypatch.setattr(queue.calls, "tenant", spy)
    r.step(T0 + 1000)
    assert queue.redis.hget(queue.keys.tenant_clock, SLOTS) == "2"  # 6 slots on 3 workers
    r.step(T0 + 2000)
    assert sent == [("slots", "2")]  # written once: unchanged since
    lease_ms = int(queue.config.lease_s * 1000)
    for i in range(2):
        heartbeat(queue, f"w{i}", [], now_ms=T0 + lease_ms)
    r.step(T0 + lease_ms + 1000)  # w2 (3 slots) is past its lease
    assert queue.redis.hget(queue.keys.tenant_clock, SLOTS) == "1.5"
    remove_tenant(queue, "a")
    assert not queue.redis.exists(queue.keys.tenant_clock)


def start(q: Queue, wid: str, concurrency: int) -> None:
    """A worker process starting as ``gpuq worker --concurrency N --name wid`` registers."""
    gpu = GpuInfo("A100", f"uuid-{wid}", 80, None, "declared")
    fields = worker_record.identity(wid, gpu, RESERVE_GB, concurrency, "0123", "h", 1)
    Presence(q.redis, q.keys, wid).register(fields, 30_000)


def test_a_round_reads_only_the_workers_it_has_not_seen(make_real_queue: MakeQueue) -> None:
    """Issue 20: each round read every live worker's concurrency while tenancy was on, a
    command a worker (2,049 of a round's 8,754 at 2,048 workers)."""
    q = make_real_queue()
    for i, slots in enumerate((1, 2, 3)):
        start(q, f"w{i}", slots)
    set_tenant(q, Tenant("a"))
    r = TenantRoom(q.redis, q.keys, q.config, q.scripts, q.calls)

    def hgets() -> int:
        return int(q.redis.info("commandstats").get("cmdstat_hget", {}).get("calls", 0))

    r.step()
    assert q.redis.hget(q.keys.tenant_clock, SLOTS) == "2"
    for _ in range(3):
        before = hgets()
        r.step()
        assert hgets() - before == 1  # the published slots; no worker again while none registers
    start(q, "w3", 2)  # a registration: every live worker is read again, once
    for reads in (1 + 4, 1):
        before = hgets()
        r.step()
        assert hgets() - before == reads
    assert q.redis.hget(q.keys.tenant_clock, SLOTS) == "2"


def test_the_published_slots_follow_workers_joining_leaving_and_restarting(queue: Queue) -> None:
    """The kept concurrency of a worker that starts again under its id with another one is
    not used: a start counts a registration, after which the room reads every worker again."""
    start(queue, "a", 1)
    start(queue, "b", 1)
    set_tenant(queue, Tenant("t"))
    r = room(queue)
    r.step()
    assert queue.redis.hget(queue.keys.tenant_clock, SLOTS) is None  # 1: never written
    start(queue, "b", 3)  # b's process restarted with --concurrency 3 under its name
    r.step()
    assert queue.redis.hget(queue.keys.tenant_clock, SLOTS) == "2"
    queue.redis.zadd(queue.keys.workers, {"b": 1})  # b past its lease, not yet reaped
    r.step()
    assert queue.redis.hget(queue.keys.tenant_clock, SLOTS) == "1"
    start(queue, "c", 5)
    r.step()
    assert queue.redis.hget(queue.keys.tenant_clock, SLOTS) == "3"
    start(queue, "c", 2)  # c again, with 2
    r.step()
    assert queue.redis.hget(queue.keys.tenant_clock, SLOTS) == "1.5"
