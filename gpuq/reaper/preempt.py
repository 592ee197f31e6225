"""Graceful preemption: the reaper reads the pool, plans (gpuq.reaper.preempt_plan, where
the rules are) and commits each decision with preempt.lua, which re-checks it atomically.

A victim's runtime and end count from when its work began: for a cold start, once its
model is loaded (the claim's ready_at, from the catalog's mean load, and no sooner than now
while the worker has not reported its handler's start: a load may outlast its mean, and a
model's first has none), since a task asked to yield while it loads yields only after the
load, which is then thrown away. A waiting task's start-by time is its `score`, its latest
start its deadline less its estimate.

``Preemptor.step`` reads the pool (bounded: the running set, then, only if some worker could
be a victim's, the heads of the P0/P1 queues); a task with a live reservation is not planned
again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import redis

from gpuq import work_index
from gpuq.clock import server_ms
from gpuq.config import Config
from gpuq.keys import Keys, live_reservation
from gpuq.reaper.known_workers import UntilRegistration
from gpuq.reaper.preempt_limits import charge_of, read_limits
from gpuq.reaper.preempt_options import Idle as Idle
from gpuq.reaper.preempt_options import Victim as Victim
from gpuq.reaper.preempt_options import Waiting as Waiting
from gpuq.reaper.preempt_options import idle_to_read, split_idle
from gpuq.reaper.preempt_options import may_be_asked as may_be_asked
from gpuq.reaper.preempt_plan import Decision as Decision
from gpuq.reaper.preempt_plan import plan as plan
from gpuq.reaper.preempt_plan import quiet_until as quiet_until
from gpuq.replies import scored
from gpuq.scripts import Calls, Scripts
from gpuq.wire import exchange
from gpuq.worker_record import AWAY, WorkerFields, field_number, lane_skips

log = logging.getLogger(__name__)

URGENT_LEVELS = (0, 1)  # priorities preemption is planned for
MODELS_LOOKED_AT = 32  # per level, in head-score order (at most one per candidate worker)
TASKS_PER_QUEUE = 2
Shape = tuple[float, str, int, "frozenset[str] | None"]  # a live worker's usable GB, levels, gpus, handlers
# fixed while a worker lives
GPU_FIELDS = WorkerFields(("vram_total_gb", "kv_reserve_gb", "levels", "gpus", "handlers"))
# a running task's, as read_workers reads them (worker_loads: vram_gb and model last)
RUNNING_FIELDS = ("state", "token", "worker", "priority", "started_at", "est_s", "preemptible",
                  "preemptions", "yield_by", "ready_at", "loading", "charged", "vram_gb", "model")


class Preemptor:
    def __init__(self, client: redis.Redis, keys: Keys, config: Config, scripts: Scripts,
                 calls: Calls) -> None:
        self.redis = client
        self.keys = keys
        self.config = config
        self.scripts = scripts
        self.calls = calls
        # id -> (usable GB, levels, gpus, handlers), read once a start: all again after any registration
        self.workers: UntilRegistration[Shape] = UntilRegistration()
        self.reservation_keys: dict[str, str] = {}  # id -> its reserve:<id> key, made once
        # after a step that decided nothing: the first time (ms) a step could decide anything
        # with the pool unchanged (None: not before it changes); after one that did, its time
        self.quiet_until: int | None = None
        self.reservations_end: int | None = None  # the first live reservation's expiry
        self.idle_shapes: dict[Idle, list[str]] = {}  # the last read's idle workers by shape

    def step(self, now_ms: int | None = None) -> dict[str, int]:
        """Plan and commit; returns how many decisions of each kind took effect. now_ms: a
        virtual clock (the simulator); None plans on the server's clock, as the script runs."""
        now = server_ms(self.redis) if now_ms is None else now_ms
        self.quiet_until = None
        victims, idle, reserved = self.read_workers(now)
        # each worker serves one waiting task a round: look at no more heads than that
        candidates = len({v.worker for v in victims} - reserved)
        # the first reservation to expire frees a worker and its task: plans may change then
        self.quiet_until = self.reservations_end
        if not candidates:
            return {}
        waiting, idle = self.read_waiting(now, min(MODELS_LOOKED_AT, candidates),
                                          sorted({v.worker for v in victims} - reserved), self.idle_shapes)
        if not waiting:
            return {}
        limits = read_limits(self.redis, self.keys, {w.tenant for w in waiting})
        decisions = plan(waiting, victims, idle, reserved, self.config, now, limits)
        quiet = now if decisions else quiet_until(waiting, victims, idle, reserved, self.config, limits,
                                                  now_ms=now)
        self.quiet_until = min((t for t in (quiet, self.reservations_end) if t is not None), default=None)
        done: dict[str, int] = {}
        for d in decisions:
            grace = None if d.kind == "reserve" else int(self.config.grace_s * 1000)
            # long enough for the victim to end (or be stopped) and the claim to follow
            life_s = (d.ends_in_s if d.kind == "reserve" else self.config.grace_s + self.config.stop_s)
            reserve_ms = int((life_s + 2 * self.config.heartbeat_s + self.config.reap_interval_s) * 1000)
            outcome, why = self.scripts.run(self.calls.preempt(
                d.waiting.id, d.victim.worker, d.victim.id, d.victim.token, reserve_ms=reserve_ms,
                grace_ms=grace, now_ms=now_ms or 0, also=[(v.id, v.token) for v in d.victims[1:]]))
            if outcome == "stale":
                log.info("preempt.stale task=%s worker=%s: %s", d.waiting.id, d.victim.worker, why)
                continue
            event = "preempt.reserved" if outcome == "reserved" else "preempt.yield_asked"
            log.info("%s task=%s priority=P%d worker=%s victim=%s victim_priority=P%d ends_in_s=%.1f",
                     event, d.waiting.id, d.waiting.priority, d.victim.worker,
                     ",".join(v.id for v in d.victims), d.victim.priority, d.ends_in_s)
            done[outcome] = done.get(outcome, 0) + 1
        return done

    def read_waiting(self, now_ms: int, models: int = MODELS_LOOKED_AT, workers: Sequence[str] = (),
                     idle: Mapping[Idle, Sequence[str]] | None = None) -> tuple[list[Waiting], list[Idle]]:
        """Heads of the P0/P1 queues (of the ``models`` queues with the oldest heads per
        level) without a live reservation, each with those of ``workers`` (the victims')
        whose claims skip its model; and the idle shapes (``idle``: each with its workers)
        with the workers of those that could claim a head that skip models split out
        (preempt_options.split_idle). The `lanes` entries come with the reservations."""
        k, r = self.keys, self.redis
        pipe = r.pipeline(transaction=False)
        for p in URGENT_LEVELS:
            work_index.read_level(pipe, k, p, 0, models)
        pairs = [(p, m) for p, got in zip(URGENT_LEVELS, pipe.execute()) for m in work_index.models(got)]
        idle = idle or {}
        if not pairs:
            return [], list(idle)
        pipe = r.pipeline(transaction=False)
        for p, m in pairs:
            pipe.zrange(k.queue(p, m), 0, TASKS_PER_QUEUE - 1, withscores=True)
        heads = [(p, m, str(i), int(score)) for (p, m), head in zip(pairs, pipe.execute())
                 for i, score in head]
        pipe = r.pipeline(transaction=False)
        for _, _, i, _ in heads:
            pipe.hmget(k.task(i), "vram_gb", "reserved_for", "offered", "score", "gpus", "tenant", "handler",
                       "deadline", "est_s")
        rows = pipe.execute()
        # the start-by is the task's `score` (the queue's score is its fair order with tenants)
        waiting = [(Waiting(i, p, float(need), _ms(start_by, score), str(offered or ""), int(gpus or 1),
                            str(tenant or ""), m, str(handler or ""), latest_ms=latest(deadline, est)),
                    str(holder or ""))
                   for (p, m, i, score), (need, holder, offered, start_by, gpus, tenant, handler,
                                           deadline, est) in zip(heads, rows) if need is not None]
        holders = sorted({h for _, h in waiting if h})
        # almost always no entry: lanes are few, skips rarer
        laned = [*workers, *idle_to_read(idle, (w for w, _ in waiting))]
        pipe = r.pipeline(transaction=False)
        for h in holders:
            pipe.get(k.reservation(h))
        if laned:
            pipe.hmget(k.lanes, *laned)
        got_back = pipe.execute()
        live = {h: got[0] for h, v in zip(holders, got_back) if (got := live_reservation(v, now_ms))}
        skips = {w: lane_skips(entry, now_ms) for w, entry in zip(laned, got_back[-1] if laned else ())}
        skipping: dict[str, list[tuple[str, int]]] = {}  # model -> (victim's worker, end)
        for w in workers:
            for m, end in skips[w].items():
                skipping.setdefault(m, []).append((w, end))
        return ([replace(w, skipped_by=tuple(skipping.get(w.model, ()))) for w, h in waiting
                 if live.get(h) != w.id], split_idle(idle, skips))

    def read_workers(self, now_ms: int) -> tuple[list[Victim], list[Idle], set[str]]:
        """Running preemptible tasks with their workers' GPU size and lanes, the idle workers
        (one of each claimable VRAM, lanes and GPUs: the plan asks only whether one fits),
        and the workers already reserved: two round trips, whatever the pool's size, and a
        third, one read per busy worker, for the victims' workers' states (``staying``)."""
        k, r = self.keys, self.redis
        live_raw, idle_raw, running_raw, registrations, gate = exchange(r, [
            ("ZRANGEBYSCORE", k.workers, now_ms, "+inf"), ("ZRANGE", k.idle, 0, -1, "WITHSCORES"),
            ("ZRANGE", k.running, 0, -1), ("GET", k.registrations),
            ("HGET", k.fairness, "reserved_until")], retry=True)
        live, running = [str(w) for w in live_raw], [str(i) for i in running_raw]
        self.reservations_end = None
        self.idle_shapes = {}
        if not live:
            return [], [], set()
        unknown = self.workers.unknown(live, registrations)
        # the claims' gate (lib/gates.lua): at or past every reservation's expiry, so at or
        # before now none is live and no worker's key is read (as a claim reads none)
        gated = _ms(gate, 0) <= now_ms
        commands: list[tuple[Any, ...]] = []
        if not gated:
            alive = set(live)
            names = self.reservation_keys = {w: key for w, key in self.reservation_keys.items()
                                             if w in alive}
            for w in live:
                if w not in names:
                    names[w] = k.reservation(w)
            commands.append(("MGET", *(names[w] for w in live)))
        # a worker's GPU and lanes do not change while it lives
        commands += [("HMGET", k.worker(w), *GPU_FIELDS.names) for w in unknown]
        commands += [("HMGET", k.task(i), *RUNNING_FIELDS) for i in running]
        # raw replies, packed by hiredis: at 512 workers redis-py's per-argument packing of
        # these reads was most of a pass's client time
        replies = exchange(r, commands, retry=True) if commands else []
        if err := next((x for x in replies if isinstance(x, Exception)), None):
            raise err
        held, rows = ([], replies) if gated else (replies[0], replies[1:])
        for w, f in zip(unknown, rows):
            if (record := GPU_FIELDS.record(w, f)) is not None:
                # no handlers published (a simulated worker): it runs whatever it claims
                self.workers.kept[w] = (record.usable_gb, record.levels, record.gpus,
                                        frozenset(record.handlers) or None)
        ends = {w: got[1] for w, v in zip(live, held) if (got := live_reservation(v, now_ms))}
        reserved = set(ends)
        # a reservation's end frees its worker for the planner: a quiet time ends there too
        self.reservations_end = min(ends.values(), default=None)
        info = self.workers.kept  # the live workers' (unknown() forgot the others)
        # one Idle per shape: the shapes are few, the idle workers many (a worker's skips, if
        # any, are read only for a shape that could claim a waiting task: read_waiting)
        for w, gb in scored(idle_raw):
            if (shape := info.get(str(w))) is not None:
                _, levels, gpus, handlers = shape
                key = Idle(float(gb), levels, gpus, handlers=handlers)
                self.idle_shapes.setdefault(key, []).append(str(w))
        idle = list(self.idle_shapes)
        tasks = rows[len(unknown):]
        load, frees, shares = worker_loads(r, k, tasks)
        victims = []
        for i, f, freed, (shared, sharers) in zip(running, tasks, frees, shares):
            state, token, worker, prio, started, est, pre, count, asked, ready, loading, charged, vram, \
                model = f
            if state != "running" or pre != "1" or asked or worker not in info or not started:
                continue
            usable, levels, gpus, handlers = info[worker]
            # a cold start's work begins once its model is loaded (lib/start.lua: ready_at),
            # and no sooner than now while it still loads (began.lua ends `loading`)
            began = max(int(started), int(ready or 0), now_ms if loading == "1" else 0)
            victims.append(Victim(i, int(token), worker, int(prio), began, float(est),
                                  int(count or 0), usable - (load[worker] - freed),
                                  levels, gpus, charge_of(charged), freed, str(model or ""),
                                  shared, sharers, handlers))
        return self.staying(victims), idle, reserved

    def staying(self, victims: list[Victim]) -> list[Victim]:
        """The victims whose workers are not on their way out (draining, retiring: their
        heartbeat's state): such a worker takes no new work, so its task's end frees a GPU
        nobody can use, and a drain promises its tasks their end. One read per busy worker."""
        workers = sorted({v.worker for v in victims})
        if not workers:
            return victims
        states = exchange(self.redis, [("HGET", self.keys.worker(w), "state") for w in workers], retry=True)
        leaving = {w for w, state in zip(workers, states) if state in AWAY}
        return [v for v in victims if v.worker not in leaving]


def worker_loads(client: redis.Redis, keys: Keys,
                 tasks: list[list[str | None]]
                 ) -> tuple[dict[str, float], list[float], list[tuple[float, int]]]:
    """The VRAM each worker's running tasks use, what each task's end would free, and the
    weights each shares with how many tasks. Tasks of one model on one worker (a batch, or
    slots sharing a loaded model) share its weights (the catalog's footprint, at most the
    least any of them needs): counted once, and not freed by any one of them ending, only by
    the ends of all. Fields: HMGET's, vram_gb and model last."""
    shared: dict[tuple[str, str], list[float]] = {}  # (worker, model) -> its tasks' needs
    for f in tasks:
        if f[0] == "running" and f[2]:
            # an unreadable vram_gb counts 0: a damaged hash must not hide its worker
            shared.setdefault((f[2], f[-1] or ""), []).append(field_number(f[-2]))
    pairs = [pair for pair, needs in shared.items() if len(needs) > 1]
    pipe = client.pipeline(transaction=False)
    for _, model in pairs:
        pipe.hget(keys.catalog_model(model), "vram_gb")
    weights = {pair: min(field_number(fp), *shared[pair])
               for pair, fp in zip(pairs, pipe.execute() if pairs else [])}
    load: dict[str, float] = {}
    for (worker, model), needs in shared.items():
        fp = weights.get((worker, model), 0.0)
        load[worker] = load.get(worker, 0.0) + fp + sum(n - fp for n in needs)
    # a task alone on its model frees its whole need (no shared weights are kept for it)
    frees = [field_number(f[-2]) - weights.get((f[2] or "", f[-1] or ""), 0.0) for f in tasks]
    shares = [(weights.get(pair, 0.0), len(shared.get(pair, ()))) if f[0] == "running" and f[2]
              else (0.0, 1) for f in tasks for pair in [(f[2] or "", f[-1] or "")]]
    return load, frees, shares


def latest(deadline: object, est_s: object) -> int | None:
    """A task's latest start (ms) from its stored deadline and estimate: past it, expire.lua
    ends it; None without a deadline (or a malformed one)."""
    if not deadline:
        return None
    try:
        return int(float(deadline) - float(est_s or 0) * 1000)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None


def _ms(value: object, fallback: int) -> int:
    """A stored epoch-ms field, or fallback when missing or malformed."""
    try:
        return int(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return fallback
