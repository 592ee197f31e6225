"""Property-based test of tenant quotas and counts (hypothesis), under a virtual clock.

Random sequences of enqueue (three tenants, three sizes, one or two GPUs, four priorities),
claims by four two-GPU workers, ack, fail with retry, cancel, yield (requeue), lease expiry (reap), and tenant
settings and the reaper's bounds changed or removed at any time, caps and bounds lowered
below the running use included. After every step:

- no start exceeds a quota: a claim that starts a limited tenant's task leaves the GPUs that
  tenant's running tasks run across and their VRAM within its caps, and its running tasks
  within its bound;
- the use is exact: `tenant_use` (tasks, GPUs, VRAM) equals the sum over the running tasks
  charged to each tenant, and a running task is charged exactly when its tenant is limited (caps or bound);
- the queued counts are exact, tenancy on or off: `tenant_queued` "<p>:<t>" equals the
  number of queued tasks counted there (their `fair` field).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from helpers import T0, ack, claim, enqueue, fail, reap
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gpuq import Config, Queue
from gpuq.errors import InvalidTask, StaleLease, TaskAlreadyFinished, TenantError
from gpuq.tenants import Tenant, remove_tenant, set_tenant

TENANTS = ("a", "b", "c")
LEASE = 30_000


class Sim:
    def __init__(self, queue: Queue) -> None:
        self.q, self.now, self.ids = queue, T0, []  # type: list[str]
        self.running: dict[str, int] = {}  # task id -> token

    def op_enqueue(self, tenant: str, vram: float, priority: int, gpus: int) -> None:
        self.now += 10
        caps = self.caps().get(tenant)
        try:
            self.ids.append(enqueue(self.q, self.now, tenant=tenant, vram_gb=vram, model="m",
                                    priority=f"P{priority}", est_s=5, gpus=gpus))
        except InvalidTask as exc:  # past the caps it has now: refused, nothing written
            assert caps is not None and str(exc) == f"invalid task: {caps.past_caps(gpus, vram)}", (exc, caps)
            return
        assert caps is None or caps.past_caps(gpus, vram) is None, (tenant, vram, gpus, caps)

    def op_claim(self, worker: int) -> None:
        self.now += 10
        got = claim(self.q, f"w{worker}", 40, loaded=[("m", 1.0)], now_ms=self.now, gpus=2)
        if got is None:
            return
        self.running[got["id"]] = int(got["token"])
        tenant = self.q.redis.hget(self.q.keys.task(got["id"]), "tenant")
        caps = self.caps().get(tenant)
        if caps is not None:
            _, gpus, vram = self.charged()[tenant]
            assert caps.max_gpus is None or gpus <= caps.max_gpus, (tenant, gpus, caps)
            assert caps.max_vram_gb is None or vram <= caps.max_vram_gb + 1e-9, (tenant, vram, caps)
        bound = self.bounds().get(tenant)
        assert bound is None or self.charged()[tenant][0] <= bound, (tenant, bound)

    def pick(self, k: int) -> tuple[str, int] | None:
        if not self.running:
            return None
        tid = sorted(self.running)[k % len(self.running)]
        return tid, self.running.pop(tid)

    def op_end(self, how: str, k: int) -> None:
        picked = self.pick(k)
        if picked is None:
            return
        tid, token = picked
        self.now += 10
        try:
            if how == "ack":
                ack(self.q, tid, token, now_ms=self.now)
            elif how == "fail":
                fail(self.q, tid, token, now_ms=self.now)
            elif how == "yield":
                self.q.scripts.run(self.q.calls.requeue(tid, token, "yielded", preempted="yielded",
                                                        now_ms=self.now))
            else:
                self.q.cancel(tid)
        except (StaleLease, TaskAlreadyFinished):
            pass

    def op_cancel(self, k: int) -> None:
        if self.ids:
            tid = self.ids[k % len(self.ids)]
            try:
                self.q.cancel(tid)
            except TaskAlreadyFinished:
                pass
            self.running.pop(tid, None)

    def op_expire_leases(self) -> None:
        self.now += LEASE + 1000  # every lease lapses; retries come due
        reap(self.q, now_ms=self.now)
        self.running.clear()

    def op_set(self, tenant: str, weight: float, gpus: int | None, vram: float | None) -> None:
        set_tenant(self.q, Tenant(tenant, weight, gpus, vram))

    def op_bound(self, tenant: str, bound: int | None) -> None:
        self.q.scripts.run(self.q.calls.tenant("bound", tenant, "-" if bound is None else str(bound)))

    def op_remove(self, tenant: str) -> None:
        try:
            remove_tenant(self.q, tenant)
        except TenantError:
            pass

    def caps(self) -> dict[str, Tenant]:
        raw = self.q.redis.hgetall(self.q.keys.tenants)
        out = {}
        for name, value in raw.items():
            t = Tenant.parse(name, value)
            if t is not None and t.capped:
                out[name] = t
        return out

    def bounds(self) -> dict[str, int]:
        use = self.q.redis.hgetall(self.q.keys.tenant_use)
        return {t: int(use[f"bound:{t}"]) for t in TENANTS if f"bound:{t}" in use}

    def charged(self) -> dict[str, tuple[int, int, float]]:
        """Each tenant's charged running tasks, the GPUs they run across (from the tasks'
        own `gpus`) and their VRAM."""
        out: dict[str, tuple[int, int, float]] = {t: (0, 0, 0.0) for t in TENANTS}
        for tid in self.q.redis.zrange(self.q.keys.running, 0, -1):
            value, gpus = self.q.redis.hmget(self.q.keys.task(tid), "charged", "gpus")
            if value:
                t, vram, *_ = value.split(" ")
                tasks, used, gb = out[t]
                out[t] = (tasks + 1, used + int(gpus or 1), gb + float(vram))
        return out

    def check(self) -> None:
        r, k = self.q.redis, self.q.keys
        caps, charged, bounds = self.caps(), self.charged(), self.bounds()
        use = r.hgetall(k.tenant_use)
        for t in TENANTS:
            tasks, gpus, vram = charged[t]
            assert int(use.get(f"tasks:{t}", 0)) == tasks, (t, use, charged)
            assert int(use.get(f"gpus:{t}", 0)) == gpus, (t, use, charged)
            assert abs(float(use.get(f"vram:{t}", 0)) - vram) < 1e-6, (t, use, charged)
        for tid in r.zrange(k.running, 0, -1):
            f = r.hmget(k.task(tid), "tenant", "charged")
            assert (f[1] is not None) == (f[0] in caps or f[0] in bounds), (tid, f, caps, bounds)
        truth: Counter[str] = Counter()
        for tid in self.ids:
            state, fair = r.hmget(k.task(tid), "state", "fair")
            if state == "queued" and fair:
                truth[fair] += 1
        counted = {f: int(n) for f, n in r.hgetall(k.tenant_queued).items()}
        assert counted == dict(truth), (counted, truth)


OPS = st.lists(st.one_of(
    st.tuples(st.just("enqueue"), st.sampled_from(TENANTS), st.sampled_from([2.0, 5.0, 10.0]),
              st.integers(0, 3), st.sampled_from([1, 1, 2])),
    st.tuples(st.just("claim"), st.integers(0, 3)),
    st.tuples(st.just("end"), st.sampled_from(["ack", "fail", "yield", "cancel"]), st.integers(0, 9)),
    st.tuples(st.just("cancel"), st.integers(0, 30)),
    st.tuples(st.just("expire_leases")),
    st.tuples(st.just("set"), st.sampled_from(TENANTS), st.sampled_from([0.5, 1.0, 3.0]),
              st.one_of(st.none(), st.integers(0, 3)), st.one_of(st.none(), st.sampled_from([4.0, 12.0]))),
    st.tuples(st.just("remove"), st.sampled_from(TENANTS)),
    st.tuples(st.just("bound"), st.sampled_from(TENANTS), st.one_of(st.none(), st.integers(1, 3))),
), min_size=10, max_size=60)


@pytest.mark.parametrize("kind, examples", [("fake", 80), ("real", 60)])
def test_quotas_hold_and_counts_stay_exact(kind: str, examples: int,
                                           connect: Callable[[str], redis.Redis], prefix: str) -> None:
    client = connect(kind)

    @settings(max_examples=examples, deadline=None, database=None,
              phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
              suppress_health_check=[HealthCheck.too_slow])
    @given(ops=OPS)
    def check(ops: list[tuple[Any, ...]]) -> None:
        sim = Sim(Queue(client, Config(pool=f"t{uuid.uuid4().hex[:10]}", prefix=prefix)))
        for name, *args in ops:
            getattr(sim, f"op_{name}")(*args)
            sim.check()

    check()
