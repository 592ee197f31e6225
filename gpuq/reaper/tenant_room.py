"""Room for tenants' recent demand: how many running tasks each tenant may borrow up to.

Weights order a level's queue (lib/tenancy.lua) but cannot free a GPU: a tenant flooding the
pool holds every GPU, and another tenant's task waits for one to free up, however light its
traffic. So each round, while tenancy is on, the reaper keeps room. A tenant's demand is the
work it offers: the est_s of the tasks it enqueued per second (enqueue.lua keeps the totals,
``tenant:work``), averaged with a half-life of ``tenant_half_life_s``, in workers kept busy.
Work offered, not tasks waiting: a tenant's backlog grows with the wait, and room sized by
it would grow with every wait it should prevent. A tenant whose demand is within its share
(its weight over the weights of the tenants with demand, times the live workers) is never
bound. One whose demand exceeds its share borrows: it may run what the room the others'
demand needs leaves, its bound, which claims enforce as they do a cap (lib/quota.lua). The
others' room is their demand (each counted up to its share), D, plus ``tenant_headroom``
x sqrt(D), at most their shares: square-root staffing, since Poisson arrivals of mean load D
vary by about sqrt(D), so the flooding tenant leaves idle workers for the others' next tasks
without reserving a worker for every light tenant. A bound is at least the tenant's share
(and one). A tenant's demand and room count at most the tasks its ``max_gpus`` lets run:
room it could never use is not kept from the others. With one tenant with demand, or
``tenant_headroom`` 0, nobody is bound. The
demand lives in the reaper's memory: a standby that takes over starts from what it reads
then. Each round also publishes the slots per live worker for the fair order (lib/fair.lua).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

import redis

from gpuq.clock import server_ms
from gpuq.config import Config
from gpuq.keys import SLOTS, Keys
from gpuq.reaper.known_workers import UntilRegistration
from gpuq.scripts import Calls, Scripts
from gpuq.tenants import DEFAULT_WEIGHT, bounds_of, registered

log = logging.getLogger(__name__)

ACTIVE = 0.05  # demand (tasks) below which a tenant has none: its decay's tail is not room
QUIET_MS = 86_400_000  # an unregistered tenant with no task queued after this is forgotten
FORGET_PER_ROUND = 100  # tenants looked at a round, in turn by name


def plan_bounds(demand: Mapping[str, float], weights: Mapping[str, float], live: int,
                headroom: float, caps: Mapping[str, int] | None = None) -> dict[str, int]:
    """The bound of each tenant borrowing beyond its share: live workers less the room the
    other tenants' demand needs (see the module's docstring). caps: the most tasks a
    tenant's ``max_gpus`` lets run; no room is kept for a tenant beyond it."""
    caps = caps or {}
    capped = {t: min(d, caps.get(t, math.inf)) for t, d in demand.items()}
    active = {t: d for t, d in capped.items() if d >= ACTIVE}
    if len(active) < 2 or headroom <= 0 or live < 1:
        return {}
    total = sum(weights.get(t, DEFAULT_WEIGHT) for t in active)
    share = {t: weights.get(t, DEFAULT_WEIGHT) / total * live for t in active}
    kept = {t: min(d, share[t]) for t, d in active.items()}
    bounds = {}
    for t, d in active.items():
        if d <= share[t]:
            continue
        others = sum(kept.values()) - kept[t]
        reach = sum(caps.get(o, math.inf) for o in active if o != t)  # what their caps let run
        room = min(sum(share.values()) - share[t], others + headroom * math.sqrt(others), reach)
        bound = max(1, math.floor(live - room + 1e-9))
        if bound < live:
            bounds[t] = bound
    return bounds


class TenantRoom:
    def __init__(self, client: redis.Redis, keys: Keys, config: Config, scripts: Scripts,
                 calls: Calls) -> None:
        self.redis = client
        self.keys = keys
        self.config = config
        self.scripts = scripts
        self.calls = calls
        self.demand: dict[str, float] = {}  # tenant -> work offered per second, averaged
        self.work: dict[str, float] = {}  # tenant -> its work total at the last step
        self.at: int | None = None  # ms of the last step
        self.binding = False  # whether the last step left any tenant bound
        self.forget_from = ""  # the name after which the next round looks for quiet tenants
        self.slots_of: UntilRegistration[int] = UntilRegistration()  # live worker -> its concurrency

    def step(self, now_ms: int | None = None) -> int:
        """Read the work tenants offered since the last step, average their demand, and write the
        bounds that changed; returns how many did. now_ms: a virtual clock (the simulator)."""
        k, r = self.keys, self.redis
        now = server_ms(r) if now_ms is None else now_ms
        pipe = r.pipeline(transaction=False)
        pipe.hgetall(k.tenants)
        pipe.hgetall(k.tenant_work)
        pipe.hgetall(k.tenant_use)
        pipe.zrangebyscore(k.workers, now, "+inf")
        pipe.hget(k.tenant_clock, SLOTS)
        pipe.get(k.registrations)
        registry, work, use, live_ids, published, registrations = pipe.execute()
        if not registry:  # tenancy is off: the last tenant's removal dropped every bound
            self.demand, self.work, self.at, self.binding = {}, {}, None, False
            self.slots_of.clear()
            return 0
        self.decay({t: float(v) for t, v in work.items()}, now)
        self.forget(work, registry, now)
        tenants = registered(registry)
        weights = {name: t.weight for name, t in tenants.items()}
        caps = {name: t.max_gpus for name, t in tenants.items() if t.max_gpus is not None}
        current = bounds_of(use)
        # bounds, demand and the fair order count running tasks: a worker runs up to its
        # concurrency at once
        live = self.slots(live_ids, registrations)
        self.publish(live, len(live_ids), published)
        bounds = plan_bounds(self.demand, weights, live, self.config.tenant_headroom, caps)
        self.binding = bool(bounds)
        changed = [(t, str(bounds[t]) if t in bounds else "-")
                   for t in sorted(set(bounds) | set(current)) if bounds.get(t) != current.get(t)]
        if changed:
            self.scripts.run(self.calls.tenant("bound", *[x for pair in changed for x in pair]))
            log.info("tenant.bounds pool=%s %s live_slots=%d", self.config.pool,
                     " ".join(f"{t}={b}" for t, b in changed), int(live))
        return len(changed)

    def publish(self, slots: int, workers: int, published: str | None) -> None:
        """The slots per live worker, for the fair order (lib/fair.lua), which multiplies the
        live workers it counts at enqueue by it rather than read every worker's concurrency
        there; written only when it changed (absent: 1), none while no worker is live."""
        if not workers:
            return
        per = f"{slots / workers:.6g}"
        if per != (published or "1"):
            self.scripts.run(self.calls.tenant("slots", per))

    def slots(self, live: list[str], registrations: object) -> int:
        """The tasks the live workers run at once: each its concurrency (a worker whose hash
        says none: one). A worker's concurrency changes only with a new start, which counts a
        registration: the kept figures hold until ``registrations`` moves, so a round reads
        only the workers it has not seen (at 2,048 workers, 2,049 commands a round less)."""
        unknown, kept = self.slots_of.unknown(live, registrations), self.slots_of.kept
        if unknown:
            pipe = self.redis.pipeline(transaction=False)
            for wid in unknown:
                pipe.hget(self.keys.worker(wid), "concurrency")
            for wid, value in zip(unknown, pipe.execute()):
                try:
                    kept[wid] = max(1, int(value))
                except (TypeError, ValueError):  # no hash (being reaped): one, read again next round
                    pass
        return sum(kept.get(w, 1) for w in live)

    def forget(self, work: Mapping[str, str], registry: Mapping[str, str], now: int) -> None:
        """Unregistered tenants without demand: their state goes once they have had no task
        queued for QUIET_MS (tenant.lua "forget" checks the rest atomically), so a pool that
        names a tenant per customer does not keep every name it has seen. A round looks at
        FORGET_PER_ROUND of them, taking turns by name."""
        quiet = sorted(t for t in work if t not in self.demand and t not in registry)
        turn = [t for t in quiet if t > self.forget_from][:FORGET_PER_ROUND]
        self.forget_from = turn[-1] if len(turn) == FORGET_PER_ROUND else ""
        if not turn:
            return
        gone = self.scripts.run(self.calls.tenant(
            "forget", str(now - QUIET_MS), *[x for t in turn for x in (t, work[t])]))
        for t in filter(None, gone.split(",")):
            self.work.pop(t, None)
        if gone:
            log.info("tenant.forgotten pool=%s tenants=%d", self.config.pool, gone.count(",") + 1)

    def decay(self, work: Mapping[str, float], now: int) -> None:
        """Each tenant's demand moves toward the work it offered per second since the last
        step (its total's rise), with the half-life; the first step only reads the totals. A
        step later than the reaper's interval (a replay skips quiet rounds) counts the work
        as offered in its last interval, the rounds before it as offering none."""
        if self.at is not None and now > self.at:
            dt = (now - self.at) / 1000
            step = min(dt, self.config.reap_interval_s) or dt
            half_life = self.config.tenant_half_life_s
            quiet = 0.5 ** ((dt - step) / half_life) if half_life > 0 else 0.0
            kept = 0.5 ** (step / half_life) if half_life > 0 else 0.0
            demand = {}
            for t in set(self.demand) | set(work):
                offered = max(0.0, work.get(t, 0.0) - self.work.get(t, 0.0)) / step
                d = offered + (self.demand.get(t, 0.0) * quiet - offered) * kept
                if d >= ACTIVE / 10:
                    demand[t] = d
            self.demand = demand
        if self.at is None or now > self.at:
            self.work, self.at = dict(work), now
