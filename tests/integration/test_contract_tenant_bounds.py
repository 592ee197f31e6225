"""Contract suite: the reaper's bounds on tenants (tenant.lua "bound", lib/quota.lua) and the
work enqueue counts for it (``tenant:work``).

Each test runs on fakeredis and on the real server (the ``queue`` fixture).
"""

from __future__ import annotations

import pytest
from helpers import T0, claim, enqueue, enqueue_specs, spec
from test_contract_handover import register

from gpuq import Queue
from gpuq.errors import TenantError
from gpuq.task import State
from gpuq.tenants import Tenant, remove_tenant, set_tenant

HELD = [("m", 4.0)]


def bound(q: Queue, *pairs: str) -> None:
    q.scripts.run(q.calls.tenant("bound", *pairs))


def take(q: Queue, worker: str, now: int) -> str | None:
    c = claim(q, worker, 100, loaded=HELD, now_ms=now)
    return None if c is None else str(c["id"])


def test_a_bound_counts_the_running_tasks_and_binds_the_next_starts(queue: Queue) -> None:
    set_tenant(queue, Tenant("b"))  # tenancy on; a is not registered (weight 1)
    a1, a2, a3 = (enqueue(queue, T0, priority="P2", model="m", tenant="a", vram_gb=4) for _ in range(3))
    assert (take(queue, "w1", T0 + 2), take(queue, "w2", T0 + 2)) == (a1, a2)
    b1 = enqueue(queue, T0 + 2, priority="P2", model="m", tenant="b", vram_gb=4)
    assert queue.redis.hgetall(queue.keys.tenant_use) == {}  # nobody limited: nothing counted
    bound(queue, "a", "2")
    assert queue.redis.hgetall(queue.keys.tenant_use) == {"gpus:a": "2", "tasks:a": "2", "vram:a": "8",
                                                         "bound:a": "2"}
    assert queue.redis.hget(queue.keys.task(a1), "charged") == "a 4"
    assert take(queue, "w3", T0 + 3) == b1  # a3 passed over: a is at its bound
    assert take(queue, "w4", T0 + 3) is None
    wakes = queue.redis.llen(queue.keys.pool_wake)
    bound(queue, "a", "3", "b", "4")  # a raised, b new: one wake for the raise
    assert queue.redis.llen(queue.keys.pool_wake) == min(16, wakes + 1)
    assert queue.redis.hget(queue.keys.tenant_use, "gpus:b") == "1"  # b now limited: counted
    assert take(queue, "w4", T0 + 4) == a3
    bound(queue, "a", "-", "b", "-")  # lifted: neither is limited, their counts go
    assert queue.redis.hgetall(queue.keys.tenant_use) == {}
    assert queue.redis.hget(queue.keys.task(a1), "charged") is None


def test_a_capped_tenant_stays_counted_when_its_bound_is_lifted(queue: Queue) -> None:
    set_tenant(queue, Tenant("a", max_gpus=5))
    a1 = enqueue(queue, T0, priority="P2", model="m", tenant="a", vram_gb=4)
    assert take(queue, "w1", T0 + 1) == a1
    bound(queue, "a", "1")
    bound(queue, "a", "-")
    assert queue.redis.hgetall(queue.keys.tenant_use) == {"gpus:a": "1", "tasks:a": "1", "vram:a": "4"}
    remove_tenant(queue, "a")  # the last one: tenancy ends, its counts and work totals go
    assert not queue.redis.exists(queue.keys.tenant_use, queue.keys.tenant_work)


def test_the_last_tenants_removal_ends_every_bound_and_charge(queue: Queue) -> None:
    set_tenant(queue, Tenant("b"))
    a1 = enqueue(queue, T0, priority="P2", model="m", tenant="a", vram_gb=4)
    assert take(queue, "w1", T0 + 1) == a1
    bound(queue, "a", "3")  # a is not registered: b's removal ends tenancy
    assert queue.redis.hget(queue.keys.task(a1), "charged") == "a 4"
    remove_tenant(queue, "b")
    assert queue.redis.hget(queue.keys.task(a1), "charged") is None
    assert not queue.redis.exists(queue.keys.tenant_use)
    bound(queue, "a", "1")  # a reaper that read the tenants before: nothing written
    assert not queue.redis.exists(queue.keys.tenant_use)


def test_a_bounded_tenants_task_is_not_handed_over(queue: Queue) -> None:
    register(queue, "w1")
    set_tenant(queue, Tenant("b"))
    bound(queue, "a", "4")
    tid = enqueue(queue, T0 + 10, priority="P0", model="m", vram_gb=4, tenant="a")
    assert queue.record(tid).state is State.QUEUED
    assert queue.redis.lrange(queue.keys.wake("w1"), 0, -1) == ["1"]  # woken to claim it


@pytest.mark.parametrize("pairs", [("a",), ("a", "0"), ("a", "1.5"), ("a", "x"), ("a b", "2"),
                                   ("", "2"), ("a", "2", "b")])
def test_bound_refuses_malformed_pairs_and_writes_nothing(queue: Queue, pairs: tuple[str, ...]) -> None:
    set_tenant(queue, Tenant("b"))
    before = queue.redis.hgetall(queue.keys.tenant_use)
    with pytest.raises(TenantError, match="bound takes"):
        bound(queue, *pairs)
    assert queue.redis.hgetall(queue.keys.tenant_use) == before


def test_enqueue_adds_each_tenants_work_while_tenancy_is_on(queue: Queue) -> None:
    enqueue(queue, T0, model="m", tenant="a", est_s=9)
    assert not queue.redis.exists(queue.keys.tenant_work)  # tenancy off: nothing counted
    set_tenant(queue, Tenant("b"))
    enqueue_specs(queue, [spec(model="m", tenant="a", est_s=2), spec(model="m", tenant="a", est_s=3),
                          spec(model="m", tenant="b", est_s=0.5)], now_ms=T0 + 1)
    assert queue.redis.hgetall(queue.keys.tenant_work) == {"a": "5", "b": "0.5"}
