"""The reaper loop: hold the pool's lock, then run one round every ``reap_interval_s``.

Every instance runs this loop; only the lock holder acts. The lock expires after
``reaper_lock_s`` unless renewed, so a standby takes over within that time when the active
reaper dies. A round: recover dead workers' tasks and due retries (reap.lua), expire queued
tasks that can no longer meet their deadline (expire.lua), park the tasks no live worker can
hold out of their queues until one can (park.lua), plan graceful preemption for
waiting online work (preempt.py), keep room for tenants' recent demand (tenant_room.py), and
publish scale signals and warm hints (scale.py).
Each step is bounded; a failing step is logged and the others still run.

Between rounds the active reaper blocks on the pool's ``urgent`` token, which enqueue posts
when online or nearline work finds no idle worker: it then plans preemption at once. A P0
task's 200 ms SLA cannot wait for the next round (half a second away on average). For
the same reason it wakes at the due time of the earliest delayed task (a retry, a task
enqueued with a delay, a child its parents released) when that comes before the next round,
and promotes it then. Each round also enqueues the due runs of periodic tasks
(``gpuq.schedule``).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import redis

from gpuq import backoff, catalog, eviction, recovery, schedule
from gpuq.clock import from_time_reply, server_ms
from gpuq.config import Config
from gpuq.connection import denied, redis_errors
from gpuq.failover import follow_master
from gpuq.keys import Keys
from gpuq.reaper.preempt import Preemptor
from gpuq.reaper.scale import Scaler
from gpuq.reaper.scale_hook import CommandHook
from gpuq.reaper.tenant_room import TenantRoom
from gpuq.scripts import Calls, ReapResult, Scripts

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_LOAD_HORIZON_MS = 600_000  # expiry looks ahead at most this far for cold model loads
# urgent passes come at most this often: under a flood of online work with every GPU busy,
# tokens posted meanwhile wait for the next pass, which plans for every waiting task at once
URGENT_GAP_S = 0.05
EXPIRE_PAGES = 50  # calls of 100 tasks per round: bounds a round's expiry work
PARK_PAGES = 10  # calls of 100 tasks each way per round (park.lua)
STALE_LOOKOUT_MS = 60_000  # a lookout this far past its due time has died or changed shape


@dataclass
class Round:
    recovered: ReapResult = field(default_factory=lambda: ReapResult(0, 0, 0, 0))
    expired: int = 0
    parked: tuple[int, int] = (0, 0)  # tasks parked, tasks put back in their queues
    preemptions: dict[str, int] = field(default_factory=dict)
    scale_signals: int = 0
    warm_hints: int = 0
    scheduled: int = 0  # periodic runs enqueued
    bounds: int = 0  # tenants' bounds changed (gpuq.reaper.tenant_room)

    def summary(self) -> str:
        r = self.recovered
        return (f"requeued {r.requeued}, failed {r.failed}, dead workers {r.dead_workers}, "
                f"retries promoted {r.promoted}, expired {self.expired}, "
                f"parked {self.parked[0]}, put back {self.parked[1]}, "
                f"reserved {self.preemptions.get('reserved', 0)}, "
                f"asked to yield {self.preemptions.get('yield', 0)}, "
                f"scale signals {self.scale_signals}, warm hints {self.warm_hints}, "
                f"periodic runs {self.scheduled}, tenant bounds changed {self.bounds}")


class Reaper:
    def __init__(self, client: redis.Redis, config: Config) -> None:
        self.redis = client
        self.config = config
        self.keys = Keys(config.pool, config.prefix)
        self.scripts = Scripts(client, self.keys)
        self.calls = Calls(config)
        self.token = uuid.uuid4().hex
        self.preemptor = Preemptor(client, self.keys, config, self.scripts, self.calls)
        self.scaler = Scaler(client, self.keys, config)
        self.room = TenantRoom(client, self.keys, config, self.scripts, self.calls)
        self.active: bool | None = None  # None: not yet known, so the first round logs
        self.stopped = threading.Event()

    def lead(self) -> bool:
        active = self.scripts.run(self.calls.lead(self.token))
        if active != self.active:
            log.info("reaper.%s pool=%s token=%s", "active" if active else "standby",
                     self.config.pool, self.token[:8])
            if active:  # what it told the hook before its standby may have been overridden
                self.scaler.forget()
        self.active = active
        return active

    def once(self) -> Round | None:
        """One round under the pool's lock, the lock given back after it; None while another
        reaper holds it (two rounds at once would recover, expire and preempt side by side)."""
        if not self.lead():
            return None
        try:
            return self.round()
        finally:
            self.scripts.run(self.calls.lead(self.token, release=True))

    def reap_once(self) -> ReapResult:
        """One full recovery pass (repeats the bounded script until nothing is left)."""
        return recovery.reap_all(self.scripts, self.calls, log, self.config.pool)

    def expire(self, now_ms: int = 0, horizon_ms: int | None = None,
               entries: list[catalog.ModelEntry] | None = None) -> int:
        """Expire queued tasks whose deadline passed or can no longer be met: bounded calls
        of 100, paging past the tasks each call keeps. now_ms and horizon_ms: the simulator's
        virtual clock and its longest load so far (by default the server's clock and the
        catalog's longest mean load; entries: the catalog, if the round read it already, else
        a page of it, catalog.CatalogPages)."""
        if horizon_ms is None:
            entries = self.scaler.catalog.read(self.redis, self.keys) if entries is None else entries
            longest = max((m.mean_load_s for m in entries), default=0.0)
            horizon_ms = min(MAX_LOAD_HORIZON_MS, int(longest * 1000))
        total = offset = 0
        for _ in range(EXPIRE_PAGES):
            expired, looked, kept = self.scripts.run(self.calls.expire(
                limit=100, horizon_ms=horizon_ms, offset=offset, now_ms=now_ms))
            total += expired
            # the kept ones stay in front: page past them (and only them: the expired, the
            # ended and the corrupt left the window)
            offset += kept
            if looked < 100:
                break
        if total:
            log.warning("task.expired pool=%s count=%d", self.config.pool, total)
        return total

    def park(self) -> tuple[int, int]:
        """Tasks no live worker can hold out of their queues, and back once one can
        (park.lua), weighed against the live workers the scale step read this round (none
        parked before its first step): bounded calls of 100, while a call finds more."""
        live = self.scaler.live_classes
        if live is None:
            return 0, 0
        parked = unparked = 0
        for _ in range(PARK_PAGES):
            p, u, left = self.scripts.run(self.calls.park(live, limit=100))
            parked, unparked = parked + p, unparked + u
            if p < 100 and left < 100:
                break
        if parked or unparked:
            log.warning("task.parked pool=%s parked=%d put_back=%d", self.config.pool, parked, unparked)
        return parked, unparked

    def round(self) -> Round:
        """One round of every duty; a step that fails is logged and the rest still run."""
        out = Round()
        self.redis.hset(self.keys.settings, "min_workers", self.config.min_workers)
        out.recovered = self._step("recover", self.reap_once, out.recovered)
        out.scheduled = self._step("schedules", self.fire_schedules, 0)
        # the catalog (a hash a model; a page of them a round) is read once for the two steps
        entries = self._step("catalog", lambda: self.scaler.catalog.read(self.redis, self.keys), None)
        out.expired = self._step("expire", lambda: self.expire(entries=entries), 0)
        out.preemptions = self._step("preempt", self.preemptor.step, {})
        out.bounds = self._step("tenants", self.room.step, 0)
        plan = self._step("scale", lambda: self.scaler.step(entries=entries), None)
        out.parked = self._step("park", self.park, (0, 0))
        self._step("lookouts", self.prune_lookouts, 0)
        if plan is not None:
            out.scale_signals, out.warm_hints = len(plan.signals), len(plan.hints)
        return out

    def prune_lookouts(self) -> int:
        """Drop lookouts long past due: only a claim of the same shape replaces one, so the
        entries of dead workers and of shapes gone (a worker's free VRAM moves) would stay.
        Not atomic: an entry a claim rewrites meanwhile may go too, which costs at most one
        more idle worker looking again when the deferral ends."""
        now = server_ms(self.redis)
        stale = [shape for shape, value in self.redis.hgetall(self.keys.lookouts).items()
                 if not (due := str(value).partition(" ")[0]).isdigit()
                 or int(due) < now - STALE_LOOKOUT_MS]
        if stale:
            self.redis.hdel(self.keys.lookouts, *stale)
        return len(stale)

    def _step(self, name: str, step: Callable[[], T], default: T) -> T:
        try:
            return step()
        except redis.RedisError:
            raise  # the loop logs it and tries again next round
        except Exception:
            log.exception("reaper.step_failed pool=%s step=%s", self.config.pool, name)
            return default

    def warn_eviction(self) -> None:
        """Log once, at start, that the server may evict keys (gpuq.eviction)."""
        if (risk := eviction.risk(self.redis)) is not None:
            log.warning("redis.may_evict pool=%s: %s", self.config.pool, risk)

    def run(self, once: bool = False) -> int:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stopped.set())
            signal.signal(signal.SIGINT, lambda *_: self.stopped.set())
        with redis_errors(self.config.redis_url):
            self.warn_eviction()
            if once:
                self.once()
                return 0
            next_round = next_urgent = 0.0
            outage = backoff.Outage(f"reaper={self.token[:8]} pool={self.config.pool}", log)
            retry = backoff.Backoff()
            while not self.stopped.is_set():
                started = time.monotonic()
                try:
                    if started >= next_round:
                        next_round = time.monotonic() + self.config.reap_interval_s
                        follow_master(self.redis)  # a planned failover: gpuq.failover
                        if self.lead():
                            self.round()
                        outage.up(started)
                        retry.reset()
                    plan_at = self.planned_pass(next_round)
                    due_at = self.next_due(next_round)
                    woken = self.wait_urgent(next_urgent, min(plan_at, due_at))
                    now = time.monotonic()
                    planned = plan_at < next_round and now >= plan_at
                    due = due_at < next_round and now >= due_at
                    if (woken == "1" or planned or due) and not self.still_leads(woken):
                        continue
                    if woken == "1":
                        self.urgent()
                        next_urgent = time.monotonic() + URGENT_GAP_S
                    elif planned:
                        self.urgent()
                    if due:
                        self._step("promote", self.reap_once, None)
                except redis.RedisError as exc:  # down or restarting: said once, retried with backoff
                    if denied(exc):  # this user may not: one line and exit 1, as at --once
                        raise
                    outage.down(exc)
                    next_round = 0.0  # the round that failed runs again once Redis answers
                    self.stopped.wait(retry.delay())
            if isinstance(hook := self.scaler.hook, CommandHook):  # not waited on at exit
                hook.close()
            self.scripts.run(self.calls.lead(self.token, release=True))
        return 0

    def planned_pass(self, next_round: float) -> float:
        """When (monotonic) the next preemption pass is due: at the next round, or sooner
        when the last pass decided nothing and said when one could (a victim coming of age,
        a reservation ending), so online work does not wait up to a round for it. That time
        is on the server's clock, which the planner reads."""
        quiet = self.preemptor.quiet_until
        if not self.active or quiet is None:
            return next_round
        now = time.monotonic()
        at = now + (quiet - server_ms(self.redis)) / 1000
        return min(next_round, at) if at > now else next_round

    def next_due(self, next_round: float) -> float:
        """When (monotonic) the earliest delayed task is due, if before the next round and
        this reaper is active: it is promoted then, not up to a round late."""
        if not self.active:
            return next_round
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrange(self.keys.delayed, 0, 0, withscores=True)
        pipe.time()
        first, clock = pipe.execute()
        if not first:
            return next_round
        now = time.monotonic()
        due_s = (float(first[0][1]) - from_time_reply(clock)) / 1000
        return min(next_round, now + max(0.0, due_s))

    def fire_schedules(self) -> int:
        """Enqueue the due run of each periodic task (gpuq.schedule); the runs enqueued."""
        return schedule.fire_due(self.redis, self.keys, self.scripts, self.calls)

    def wait_urgent(self, not_before: float, until: float) -> str | None:
        """Until the next round (monotonic ``until``): the active reaper blocks on the urgent
        list from ``not_before`` on (a standby must not take it). Returns the token that came:
        "1", online work waits (plan preemption now); "due", a delayed task became the first
        due (the loop reads the due time again)."""
        if not self.active:
            self.stopped.wait(max(0.0, until - time.monotonic()))
            return None
        if not_before > time.monotonic():
            self.stopped.wait(min(not_before, until) - time.monotonic())
        seconds = until - time.monotonic()
        if seconds <= 0:
            return None
        popped = self.redis.blpop([self.keys.urgent], timeout=max(0.01, seconds))
        return None if popped is None else str(popped[1])

    def still_leads(self, woken: str | None) -> bool:
        """Before a pass between rounds: whether this reaper still holds the pool's lock. One
        frozen while it waited (SIGSTOP, a paused VM) may have lost it to a standby, which
        plans now; the token it popped (``woken``) goes back for that one."""
        if self.lead():
            return True
        if woken:
            self.redis.lpush(self.keys.urgent, woken)
        return False

    def urgent(self) -> dict[str, int]:
        """A preemption pass now, for online work that found no idle worker."""
        none: dict[str, int] = {}
        done = self._step("preempt", self.preemptor.step, none)
        if done:
            log.info("reaper.urgent pool=%s %s", self.config.pool,
                     " ".join(f"{k}={v}" for k, v in sorted(done.items())))
        return done
