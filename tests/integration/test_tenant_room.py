"""The reaper's room for tenants' recent demand (gpuq.reaper.tenant_room) on a pool: the
work tenants enqueue sets the bounds it writes, which lift as the demand fades."""

from __future__ import annotations

from dataclasses import replace

from helpers import T0, enqueue_specs, heartbeat, spec

from gpuq import Queue
from gpuq.reaper.tenant_room import TenantRoom
from gpuq.tenants import Tenant, remove_tenant, set_tenant


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
