"""Contract suite: tenants share a level by weight and stay within their caps.

Each test runs on fakeredis and on the real server (the ``queue`` fixture). The fair order
and the quotas live in the scripts (lua/lib/tenancy.lua, lua/lib/quota.lua); registration in
tenant.lua (``gpuq.tenants``).
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from helpers import T0, ack, claim, enqueue, enqueue_specs, fail, heartbeat, register_worker, spec
from test_contract_handover import register

from gpuq import Queue
from gpuq.errors import InvalidTask, TenantError
from gpuq.reaper.preempt import Preemptor
from gpuq.reaper.tenant_room import TenantRoom
from gpuq.task import State, TaskSpec
from gpuq.tenants import Tenant, read, remove_tenant, require_registered, set_tenant

HELD = [("m", 4.0)]


def live_workers(q: Queue, n: int) -> None:
    for i in range(n):
        heartbeat(q, f"live{i}", [], now_ms=T0)


def claim_ids(q: Queue, n: int, now: int, vram: float = 100) -> list[str]:
    out = []
    for i in range(n):
        c = claim(q, f"c{i}", vram, loaded=HELD, now_ms=now)
        assert c is not None
        out.append(c["id"])
    return out


def tenant_of(q: Queue, tid: str) -> str:
    return q.redis.hget(q.keys.task(tid), "tenant")


def test_without_tenants_the_order_is_the_start_by_order(queue: Queue) -> None:
    flood = [enqueue(queue, T0, priority="P1", model="m", tenant="a", est_s=10) for _ in range(6)]
    light = enqueue(queue, T0 + 10, priority="P1", model="m", tenant="b", est_s=10)
    assert claim_ids(queue, 7, T0 + 20) == [*flood, light]
    assert not queue.redis.exists(queue.keys.tenant_queued)


def test_a_light_tenant_goes_ahead_of_a_flooding_tenants_backlog(queue: Queue) -> None:
    set_tenant(queue, Tenant("a"))  # tenancy on; b is unregistered: weight 1
    live_workers(queue, 4)
    flood = [s.task_id for s in (spec(priority="P1", model="m", tenant="a", est_s=10)
                                 for _ in range(20))]
    enqueue_specs(queue, [spec(task_id=t, priority="P1", model="m", tenant="a", est_s=10)
                          for t in flood], T0)
    light = enqueue(queue, T0 + 1000, priority="P1", model="m", tenant="b", est_s=10)
    # a's tasks are spaced 10 s / 4 live workers apart from its first arrival (its start-by
    # less the SLA: T0); b, with no backlog, is placed at its arrival, T0 + 1 s: second
    assert claim_ids(queue, 3, T0 + 1500) == [flood[0], light, flood[1]]
    fields = queue.redis.hgetall(queue.keys.task(flood[2]))
    assert (fields["score"], fields["order"], fields["fair"]) == (str(T0 + 1000), str(T0 + 5000), "1:a")
    # the last task claimed started 1500 - 2500 ms after its place: no lag; a new task of
    # another tenant is placed at its arrival, ahead of a's backlog
    assert queue.redis.hget(queue.keys.tenant_clock, "1") == "0"
    assert queue.redis.hgetall(queue.keys.tenant_queued) == {"1:a": "18"}


def test_a_tenant_without_a_backlog_joins_where_a_lagging_service_is(queue: Queue) -> None:
    set_tenant(queue, Tenant("a"))
    live_workers(queue, 1)
    enqueue_specs(queue, [spec(priority="P1", model="m", tenant="a", est_s=1) for _ in range(50)], T0)
    # 20 s later the first claims take tasks placed at T0 and T0 + 1 s: service lags ~19 s
    claim_ids(queue, 2, T0 + 20_000)
    assert queue.redis.hget(queue.keys.tenant_clock, "1") == "19000"
    light = enqueue(queue, T0 + 20_000, priority="P1", model="m", tenant="b", est_s=1)
    # placed at its arrival less the lag, T0 + 1 s: ahead of a's 48 left (T0 + 2 s on)
    assert queue.redis.hget(queue.keys.task(light), "order") == str(T0 + 1000)
    assert claim_ids(queue, 1, T0 + 20_100) == [light]


def test_backlogged_tenants_share_a_level_by_weight(queue: Queue) -> None:
    set_tenant(queue, Tenant("a", weight=3))
    set_tenant(queue, Tenant("b", weight=1))
    live_workers(queue, 2)
    specs = [spec(priority="P2", model="m", tenant=t, est_s=5) for _ in range(30) for t in "ab"]
    enqueue_specs(queue, specs, T0)
    first = Counter(tenant_of(queue, t) for t in claim_ids(queue, 20, T0 + 10))
    assert 14 <= first["a"] <= 16 and first["a"] + first["b"] == 20


def test_a_gpu_capped_tenants_backlog_is_spaced_by_the_tasks_it_runs_at_once(queue: Queue) -> None:
    """The fair order spaces a backlogged tenant's tasks by est_s over the tasks its share
    runs at once: a cap of 4 GPUs runs two 2-GPU tasks at once, four 1-GPU ones."""
    set_tenant(queue, Tenant("a", max_gpus=4))
    live_workers(queue, 8)
    orders = {}
    for gpus in (1, 2):
        specs = [spec(priority="P2", model=f"m{gpus}", tenant="a", est_s=8, gpus=gpus) for _ in range(2)]
        enqueue_specs(queue, specs, T0 + 1000 * gpus)
        first, second = (int(queue.redis.hget(queue.keys.task(s.task_id), "order")) for s in specs)
        orders[gpus] = second - first
    assert orders == {1: 8000 // 4, 2: 8000 // 2}


def orders_of(q: Queue, specs: list[TaskSpec]) -> list[int]:
    return [int(q.redis.hget(q.keys.task(s.task_id), "order")) - T0 for s in specs]


@pytest.mark.parametrize("workers, slots", [(4, 1), (2, 2), (1, 4)])
def test_a_backlog_is_spaced_by_the_pools_slots_however_workers_hold_them(
        queue: Queue, workers: int, slots: int) -> None:
    """Found by a QA pass: the fair order counted workers, not slots, so on 2 workers x 2
    slots a flood was spaced as if 2 tasks ran at once: the same workload was shared
    otherwise than on 4 one-slot workers."""
    set_tenant(queue, Tenant("a"))
    for i in range(workers):
        heartbeat(queue, f"live{i}", [], now_ms=T0)
        queue.redis.hset(queue.keys.worker(f"live{i}"), "concurrency", slots)
    TenantRoom(queue.redis, queue.keys, queue.config, queue.scripts, queue.calls).step(T0)
    flood = [spec(priority="P1", model="m", tenant="a", est_s=10) for _ in range(6)]
    enqueue_specs(queue, flood, T0)
    late = [spec(priority="P1", model="m", tenant="b", est_s=10) for _ in range(3)]
    enqueue_specs(queue, late, T0 + 1000)
    # a alone has the 4 slots: 10 s tasks 2.5 s apart; b, with half of them, 5 s apart
    assert orders_of(queue, flood) == [0, 2500, 5000, 7500, 10_000, 12_500]
    assert orders_of(queue, late) == [1000, 6000, 11_000]


def test_workers_past_their_lease_leave_the_fair_spacing_before_they_are_reaped(queue: Queue) -> None:
    set_tenant(queue, Tenant("a"))
    live_workers(queue, 4)
    lease_ms = int(queue.config.lease_s * 1000)
    for i in range(2):
        heartbeat(queue, f"live{i}", [], now_ms=T0 + lease_ms)
    # the other two stopped renewing: their leases ended, no reaper round has run
    flood = [spec(priority="P1", model="m", tenant="a", est_s=10) for _ in range(3)]
    enqueue_specs(queue, flood, T0 + lease_ms + 1000)
    assert orders_of(queue, flood) == [lease_ms + 1000 + 5000 * i for i in range(3)]


def test_counts_follow_every_way_out_of_a_queue(queue: Queue) -> None:
    set_tenant(queue, Tenant("a"))
    ids = [enqueue(queue, T0, priority="P2", model="m", tenant="a", deadline_s=1, est_s=0.5)
           for _ in range(3)]
    counts = queue.redis.hgetall
    assert counts(queue.keys.tenant_queued) == {"2:a": "3"}
    queue.cancel(ids[0])
    got = claim(queue, "w1", 100, loaded=HELD, now_ms=T0 + 1)
    assert got is not None and counts(queue.keys.tenant_queued) == {"2:a": "1"}
    # the last one expires: the count's field goes with it
    assert queue.scripts.run(queue.calls.expire(now_ms=T0 + 5000))[0] == 1
    assert counts(queue.keys.tenant_queued) == {}
    # a retry due past its deadline ends expired, never counted again
    assert fail(queue, got["id"], got["token"], now_ms=T0 + 2) == "delayed"
    queue.scripts.run(queue.calls.reap(now_ms=T0 + 60_000))
    assert queue.record(got["id"]).state is State.EXPIRED
    assert counts(queue.keys.tenant_queued) == {}
    # a retry that can still make it comes back into the count, at its old place
    again = enqueue(queue, T0 + 60_000, priority="P2", model="m", tenant="a", est_s=0.5)
    got = claim(queue, "w1", 100, loaded=HELD, now_ms=T0 + 60_001)
    assert got is not None and got["id"] == again
    assert fail(queue, again, got["token"], now_ms=T0 + 60_002) == "delayed"
    queue.scripts.run(queue.calls.reap(now_ms=T0 + 120_000))
    assert queue.record(again).state is State.QUEUED
    assert counts(queue.keys.tenant_queued) == {"2:a": "1"}
    assert queue.redis.zscore(queue.keys.queue(2, "m"), again) == float(
        queue.redis.hget(queue.keys.task(again), "order"))


def test_a_tenant_at_its_gpu_cap_waits_while_others_run(queue: Queue) -> None:
    set_tenant(queue, Tenant("a", max_gpus=1))
    a1, a2 = (enqueue(queue, T0, priority="P1", model="m", tenant="a", vram_gb=4) for _ in range(2))
    b1 = enqueue(queue, T0 + 1, priority="P1", model="m", tenant="b", vram_gb=4)
    first = claim(queue, "w1", 100, loaded=HELD, now_ms=T0 + 2)
    second = claim(queue, "w2", 100, loaded=HELD, now_ms=T0 + 2)
    assert first is not None and second is not None
    assert (first["id"], second["id"]) == (a1, b1)
    assert claim(queue, "w3", 100, loaded=HELD, now_ms=T0 + 2) is None  # a2 passed over
    assert queue.redis.hgetall(queue.keys.tenant_use) == {"gpus:a": "1", "tasks:a": "1", "vram:a": "4"}
    assert queue.redis.hget(queue.keys.task(a1), "charged") == "a 4"
    wakes = queue.redis.llen(queue.keys.pool_wake)
    ack(queue, a1, first["token"], now_ms=T0 + 3)
    assert queue.redis.hgetall(queue.keys.tenant_use) == {}
    assert queue.redis.llen(queue.keys.pool_wake) == min(16, wakes + 1)  # the waiting can start
    third = claim(queue, "w3", 100, loaded=HELD, now_ms=T0 + 4)
    assert third is not None and third["id"] == a2


def test_a_gpu_cap_counts_the_gpus_a_task_runs_across(queue: Queue) -> None:
    set_tenant(queue, Tenant("a", max_gpus=3))
    wide, narrow, last = (enqueue(queue, T0 + i, priority="P1", model="m", tenant="a", vram_gb=4,
                                  gpus=g) for i, g in enumerate((2, 1, 2)))
    first = claim(queue, "w1", 100, loaded=HELD, now_ms=T0 + 5, gpus=2)
    second = claim(queue, "w2", 100, loaded=HELD, now_ms=T0 + 5, gpus=2)
    assert first is not None and second is not None and (first["id"], second["id"]) == (wide, narrow)
    assert claim(queue, "w3", 100, loaded=HELD, now_ms=T0 + 5, gpus=2) is None  # 3 + 2 > 3
    assert queue.redis.hgetall(queue.keys.tenant_use) == {"gpus:a": "3", "tasks:a": "2", "vram:a": "8"}
    assert queue.redis.hget(queue.keys.task(wide), "charged") == "a 4 2"
    (state,), _ = read(queue.redis, queue.keys)
    assert (state.running, state.running_gpus, state.running_vram_gb) == (2, 3, 8.0)
    ack(queue, wide, first["token"], now_ms=T0 + 6)  # gives back its two GPUs
    assert queue.redis.hgetall(queue.keys.tenant_use) == {"gpus:a": "1", "tasks:a": "1", "vram:a": "4"}
    third = claim(queue, "w3", 100, loaded=HELD, now_ms=T0 + 7, gpus=2)
    assert third is not None and third["id"] == last
    # a cap set later recounts the running tasks' GPUs the same way
    set_tenant(queue, Tenant("a", max_gpus=4))
    assert queue.redis.hgetall(queue.keys.tenant_use) == {"gpus:a": "3", "tasks:a": "2", "vram:a": "8"}
    assert queue.redis.hget(queue.keys.task(last), "charged") == "a 4 2"


def test_use_counted_before_gpus_were_is_given_back(queue: Queue) -> None:
    """A task charged as "<tenant> <vram>" (one GPU, no task count) by an earlier version."""
    set_tenant(queue, Tenant("a", max_gpus=2))
    tid = enqueue(queue, T0, priority="P1", model="m", tenant="a", vram_gb=4)
    got = claim(queue, "w1", 100, loaded=HELD, now_ms=T0 + 1)
    assert got is not None
    queue.redis.hset(queue.keys.task(tid), "charged", "a 4")
    queue.redis.hdel(queue.keys.tenant_use, "tasks:a")
    ack(queue, tid, got["token"], now_ms=T0 + 2)
    assert queue.redis.hgetall(queue.keys.tenant_use) == {}


def test_a_vram_cap_counts_the_running_tasks_needs(queue: Queue) -> None:
    set_tenant(queue, Tenant("a", max_vram_gb=15))
    ids = [enqueue(queue, T0, priority="P2", model="m", tenant="a", vram_gb=10) for _ in range(2)]
    assert claim(queue, "w1", 100, loaded=HELD, now_ms=T0 + 1) is not None
    assert claim(queue, "w2", 100, loaded=HELD, now_ms=T0 + 1) is None
    assert queue.record(ids[1]).state is State.QUEUED


def test_caps_set_later_bind_running_tasks_and_removal_gives_them_back(queue: Queue) -> None:
    set_tenant(queue, Tenant("b"))
    a1, a2 = (enqueue(queue, T0, priority="P2", model="m", tenant="a", vram_gb=4) for _ in range(2))
    got = claim(queue, "w1", 100, loaded=HELD, now_ms=T0 + 1)
    assert got is not None and got["id"] == a1
    before = set_tenant(queue, Tenant("a", weight=2, max_gpus=1))
    assert before is None
    assert queue.redis.hgetall(queue.keys.tenant_use) == {"gpus:a": "1", "tasks:a": "1", "vram:a": "4"}
    assert claim(queue, "w2", 100, loaded=HELD, now_ms=T0 + 2) is None
    assert set_tenant(queue, Tenant("a", weight=2)) == Tenant("a", 2.0, 1, None)
    assert queue.redis.hgetall(queue.keys.tenant_use) == {}
    assert queue.redis.hget(queue.keys.task(a1), "charged") is None
    got2 = claim(queue, "w2", 100, loaded=HELD, now_ms=T0 + 3)
    assert got2 is not None and got2["id"] == a2
    remove_tenant(queue, "a")
    remove_tenant(queue, "b")  # the last one: tenancy ends with its counts
    for key in (queue.keys.tenants, queue.keys.tenant_queued, queue.keys.tenant_clock,
                queue.keys.tenant_use):
        assert not queue.redis.exists(key)
    with pytest.raises(TenantError, match="'a' is not registered"):
        remove_tenant(queue, "a")


def test_a_capped_tenants_task_is_not_handed_over(queue: Queue) -> None:
    register(queue, "w1")
    set_tenant(queue, Tenant("a", max_gpus=4))
    tid = enqueue(queue, T0 + 10, priority="P0", model="m", vram_gb=4, tenant="a")
    assert queue.record(tid).state is State.QUEUED
    assert queue.redis.lrange(queue.keys.wake("w1"), 0, -1) == ["1"]  # woken to claim it


def test_a_pool_that_requires_registration_refuses_other_tenants_whole_calls(queue: Queue) -> None:
    set_tenant(queue, Tenant("a"))
    require_registered(queue, True)
    with pytest.raises(InvalidTask, match="tenant b is not registered"):
        enqueue_specs(queue, [spec(tenant="a"), spec(tenant="b")], T0)
    assert queue.redis.zcard(queue.keys.queue(2, "A")) == 0
    assert enqueue_specs(queue, [spec(tenant="a")], T0) == 1
    states, required = read(queue.redis, queue.keys)
    assert required and [s.to_dict() for s in states] == [
        {"name": "a", "registered": True, "weight": 1.0, "max_gpus": None, "max_vram_gb": None, "bound": None,
         "running": None, "running_gpus": None, "running_vram_gb": None, "queued": {"P2": 1}}]
    require_registered(queue, False)
    assert enqueue_specs(queue, [spec(tenant="b")], T0) == 1


@pytest.mark.parametrize("args, message", [
    (("set", "a b", "1", "-", "-"), "tenant name"),
    (("set", "a\x1b[31m", "1", "-", "-"), "tenant name"),
    (("set", "a", "0", "-", "-"), "weight"),
    (("set", "a", "nan", "-", "-"), "weight"),
    (("set", "a", "1", "1.5", "-"), "max_gpus"),
    (("set", "a", "1", "-", "-3"), "max_vram_gb"),
    (("set", "a", "1", "-"), "set takes"),
    (("require", "yes"), "require takes"),
    (("drop", "a"), "set, remove, require, bound, forget or slots"),
    (("forget", "soon", "a", "1"), "forget takes"),
    (("forget", "0", "a"), "forget takes"),
    (("slots", "0.5"), "slots takes"),
    (("slots", "inf"), "slots takes"),
])
def test_tenant_refuses_malformed_arguments_and_writes_nothing(queue: Queue, args: tuple[str, ...],
                                                              message: str) -> None:
    with pytest.raises(TenantError, match=message):
        queue.scripts.run(queue.calls.tenant(*args))
    assert not queue.redis.exists(queue.keys.tenants)


def test_tenant_settings_are_checked_before_they_are_sent() -> None:
    for bad in (dict(name=""), dict(name="a,b"), dict(name="a", weight=0),
                dict(name="a", max_gpus=-1), dict(name="a", max_vram_gb=float("inf"))):
        with pytest.raises(TenantError):
            Tenant(**bad)  # type: ignore[arg-type]


def test_sla_results_are_counted_per_tenant_where_they_are_decided(queue: Queue) -> None:
    set_tenant(queue, Tenant("a"))
    warm = enqueue(queue, T0, priority="P0", model="m", tenant="a")
    cold = enqueue(queue, T0, priority="P0", model="m", tenant="b")
    got = claim(queue, "w1", 100, loaded=HELD, now_ms=T0 + 50)
    assert got is not None and (got["id"], got["sla"]) == (warm, "met")
    got = claim(queue, "w2", 100, now_ms=T0 + 60)
    assert got is not None and (got["id"], got["sla"]) == (cold, "pending")
    queue.scripts.run(queue.calls.began(cold, int(got["token"]), now_ms=T0 + 5000))
    stats = queue.redis.hgetall(queue.keys.stats)
    assert (stats["sla_met:P0:a"], stats["sla_missed:P0:b"]) == ("1", "1")
    assert (stats["sla_met:P0"], stats["sla_missed:P0"]) == ("1", "1")


def test_a_corrupt_task_failed_in_its_queue_leaves_its_tenants_count(queue: Queue) -> None:
    set_tenant(queue, Tenant("a"))
    tid = enqueue(queue, T0, priority="P2", model="m", tenant="a")
    assert queue.redis.hgetall(queue.keys.tenant_queued) == {"2:a": "1"}
    queue.redis.hset(queue.keys.task(tid), "est_s", "soon")
    assert claim(queue, "w1", 100, loaded=HELD, now_ms=T0 + 1) is None
    assert queue.redis.hget(queue.keys.task(tid), "state") == "failed"
    assert queue.redis.hgetall(queue.keys.tenant_queued) == {}
    assert queue.redis.hget(queue.keys.task(tid), "fair") == ""


def test_the_planner_asks_a_capped_tenant_to_make_room_from_its_own_tasks(queue: Queue) -> None:
    """Found by a QA pass: tenant A at max_gpus 1 waited with a P0 task; the planner asked
    tenant B's task to yield (it ended sooner), which freed a GPU the claim would not give A,
    then asked A's own. Read from the claims' `charged` fields and the tenants' use."""
    now = int(time.time() * 1000)
    set_tenant(queue, Tenant("A", max_gpus=1))
    set_tenant(queue, Tenant("B"))
    for w in ("w1", "w2"):
        queue.redis.hset(queue.keys.worker(w), mapping={"vram_total_gb": 80, "kv_reserve_gb": 5})
        queue.redis.zadd(queue.keys.workers, {w: now + 60_000})
    started = now - 60_000
    b_task = enqueue(queue, started, model="m", vram_gb=16, priority="P3", est_s=500, tenant="B")
    assert claim(queue, "w1", 75, loaded=HELD, now_ms=started)["id"] == b_task  # type: ignore[index]
    a_task = enqueue(queue, started, model="m", vram_gb=16, priority="P3", est_s=600, tenant="A")
    assert claim(queue, "w2", 75, loaded=HELD, now_ms=started)["id"] == a_task  # type: ignore[index]
    enqueue(queue, now, model="m", vram_gb=16, priority="P0", est_s=5, tenant="A")
    planner = Preemptor(queue.redis, queue.keys, queue.config, queue.scripts, queue.calls)
    assert planner.step(now) == {"yield": 1}
    assert queue.redis.hget(queue.keys.task(a_task), "yield_by") is not None
    assert queue.redis.hget(queue.keys.task(b_task), "yield_by") is None


@pytest.mark.parametrize("check_fit", [True, False])
def test_a_task_past_its_tenant_s_caps_is_refused(queue: Queue, check_fit: bool) -> None:
    """Found by a QA pass: a two-GPU task of a tenant capped at one GPU (or a 16 GB task of
    one capped at 10 GB) was accepted with --check-fit and waited for ever, said nowhere;
    without check_fit it was queued, never claimed, counted in the scale signals' backlog
    and in no view's unschedulable. The caps are the pool's own: refused either way."""
    register_worker(queue, "g", gpus=2)  # a two-GPU group of 150 GB: the pool could hold them
    set_tenant(queue, Tenant("a", max_gpus=1))
    set_tenant(queue, Tenant("d", max_vram_gb=10))
    with pytest.raises(InvalidTask, match="tenant a could never run it: it needs 2 GPUs and 140 GB, "
                                          "the tenant's caps allow 1 GPUs and any GB"):
        enqueue(queue, T0, check_fit=check_fit, model="A", vram_gb=140, gpus=2, tenant="a")
    with pytest.raises(InvalidTask, match="caps allow any GPUs and 10 GB"):
        enqueue(queue, T0, check_fit=check_fit, model="A", vram_gb=16, tenant="d")
    assert queue.redis.zcard(queue.keys.queue(2, "A")) == 0
    enqueue(queue, T0, check_fit=check_fit, model="A", vram_gb=8, tenant="d")
    enqueue(queue, T0, check_fit=check_fit, model="A", vram_gb=16, tenant="e")  # no caps
    assert queue.redis.zcard(queue.keys.queue(2, "A")) == 2
    # the preflight's and schedule add's words (Tenant.past_caps) are the script's
    for cap, need in ((10.123456789, 24.123456789), (123.456789012, 140)):
        odd = Tenant("odd", max_vram_gb=cap)
        set_tenant(queue, odd)
        with pytest.raises(InvalidTask) as err:
            enqueue(queue, T0, check_fit=check_fit, model="A", vram_gb=need, tenant="odd")
        assert err.value.reason == odd.past_caps(1, need)


def test_a_reservation_for_a_capped_tenant_waits_for_its_own_task_on_that_worker(queue: Queue) -> None:
    """Found by an integrator: the planner made room for a P0 task of tenant A (capped at 1
    GPU) on the worker running A's own P3 task; the worker's next claim, from its free slot,
    dropped the reservation (A still at its cap) and took other work, and each round the
    planner reserved again (111 reservations counted for 25 tasks)."""
    now = int(time.time() * 1000)
    set_tenant(queue, Tenant("A", max_gpus=1))
    set_tenant(queue, Tenant("B"))
    queue.redis.hset(queue.keys.worker("w1"), mapping={"vram_total_gb": 80, "kv_reserve_gb": 5})
    queue.redis.zadd(queue.keys.workers, {"w1": now + 60_000})
    started = now - 60_000
    own = enqueue(queue, started, model="m", vram_gb=16, priority="P3", est_s=600, tenant="A")
    first = claim(queue, "w1", 75, loaded=HELD, slots=2, now_ms=started)
    assert first is not None and first["id"] == own
    other = enqueue(queue, now, model="m", vram_gb=16, priority="P3", tenant="B")
    urgent = enqueue(queue, now, model="m", vram_gb=16, priority="P0", est_s=5, tenant="A")
    planner = Preemptor(queue.redis, queue.keys, queue.config, queue.scripts, queue.calls)
    assert planner.step(now) == {"yield": 1}
    assert claim(queue, "w1", 59, loaded=HELD, slots=1, now_ms=now + 1) is None  # waits: no B task
    assert queue.redis.exists(queue.keys.reservation("w1"))
    assert planner.step(now + 2) == {}  # still reserved: nothing planned again
    ack(queue, own, first["token"], now_ms=now + 3)  # A's task gives way
    got = claim(queue, "w1", 75, loaded=HELD, slots=2, now_ms=now + 4)
    assert got is not None and got["id"] == urgent
    assert queue.redis.hget(queue.keys.task(other), "state") == "queued"
