"""Scale-up signals and warm hints: what the pool needs, computed once per reaper round.

``Scaler.step`` reads a bounded snapshot of the pool (``read_snapshot``), plans from it with
the pure ``gpuq.reaper.scale_plan.plan`` (its docstring states the rules), then in one MULTI
replaces the ``scale`` hash, pushes the warm hints and counts them, and finally tells the hook
about classes whose desired count changed.

The ``scale`` hash: ``class:<gpu>`` and ``model:<name>`` -> JSON {current, desired, reason, at,
and, with arrival history, rate_per_s and forecast_per_s (``gpuq.reaper.forecast``; a class's
are summed over the models whose smallest fit it is)};
``unschedulable`` -> JSON {tasks, largest_gb (the largest need), class_gb (the largest class)}
while queued tasks exceed every class; ``unregistered`` -> JSON {handler: tasks} while sampled
queued tasks name a handler that no live worker's app registers (no GPU class fixes those:
a worker running that app does). The hook gets (class, current, desired) when a class's
desired differs from what it was last told (first sight: from current); a command hook also
gets GPUQ_SCALE_REASON and, with history, GPUQ_RATE_PER_S and GPUQ_FORECAST_PER_S in its
environment (arguments stay three, so existing hooks keep working).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import subprocess
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import redis

from gpuq import catalog
from gpuq.clock import server_ms
from gpuq.config import Config
from gpuq.errors import ConfigError
from gpuq.keys import Keys, live_reservation
from gpuq.reaper import forecast
from gpuq.reaper.scale_plan import (
    AWAY,
    HINT_EVERY_MS,
    Backlog,
    ScalePlan,
    ScaleSignal,
    Snapshot,
    WorkerState,
    decimal,
    plan,
)
from gpuq.task import Priority
from gpuq.worker_record import WorkerFields

log = logging.getLogger(__name__)

Hook = Callable[[str, int, int], None]  # (GPU class, current, desired)

SAMPLE = 50  # head tasks read per queue of the DEEP deepest; their est_s and vram_gb stand for it
SAMPLE_REST = 4  # head tasks read per other queue: a round reads a bounded number of tasks
DEEP = 64  # queues sampled SAMPLE deep, the deepest (most of the backlog's work) first
MODELS_PER_LEVEL = 500  # bounds the read even if producers invent models without end
HOOK_TIMEOUT_S = 30.0
PLANNED = WorkerFields(("gpu_name", "vram_total_gb", "kv_reserve_gb", "levels", "state", "handlers"))


def _float(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


def read_snapshot(client: redis.Redis, keys: Keys, now_ms: int, config: Config | None = None,
                  est_s: Mapping[str, float] | None = None,
                  arrivals: dict[int, dict[str, int]] | None = None) -> Snapshot:
    """The pool as ``plan`` needs it, in five pipelined reads (and the catalog's two), each
    bounded: per queue its ZCARD and SAMPLE_REST head tasks (SAMPLE for the DEEP deepest),
    per live worker a few hash fields, the ``need`` index counted by VRAM bands, the arrival
    buckets the forecast reads.
    est_s: the mean est_s last sampled per model, arrivals: the buckets read before (the
    scaler's memory; see ``read_forecasts``)."""
    pipe = client.pipeline(transaction=False)
    for level in Priority:
        pipe.zrange(keys.models_with_work(level), 0, MODELS_PER_LEVEL - 1)
    pipe.zrangebyscore(keys.workers, now_ms, "+inf")
    pipe.zrange(keys.idle, 0, -1, withscores=True)
    pipe.hgetall(keys.classes)
    pipe.zrange(keys.need, -1, -1, withscores=True)
    *per_level, live, idle, classes, top = pipe.execute()
    pairs = [(int(p), str(m)) for p, names in zip(Priority, per_level) for m in names]
    models = sorted({m for _, m in pairs})
    pipe = client.pipeline(transaction=False)
    for wid in live:
        PLANNED.read(pipe, keys, wid)
        pipe.get(keys.reservation(wid))
    for p, m in pairs:
        pipe.zcard(keys.queue(p, m))
        pipe.zrange(keys.queue(p, m), 0, SAMPLE_REST - 1, withscores=True)
    for m in models:
        pipe.smembers(keys.holders(m))
    replies = iter(pipe.execute())
    idle_gb = {str(w): float(score) for w, score in idle}
    workers = []
    runnable: set[str] = set()  # handlers the live workers' apps register
    for wid in live:
        record, reserved = PLANNED.record(wid, next(replies)), next(replies)
        if record is None:  # no hash: being reaped
            continue
        runnable.update(record.handlers)
        if record.state not in AWAY:
            workers.append(WorkerState(wid, record.gpu_name, record.usable_gb, record.levels,
                                       idle_gb.get(wid), live_reservation(reserved, now_ms) is not None))
    queues = _deepen(client, keys, [(p, m, int(next(replies)), next(replies)) for p, m in pairs])
    ids = {w.id for w in workers}
    holders = {m: frozenset(next(replies)) & ids for m in models}
    sizes = {str(c): _float(v) for c, v in classes.items()}
    bounds = [*sorted(set(sizes.values()) | {w.usable_gb for w in workers}), math.inf]
    backlogs, bands, named = _sample(client, keys, queues, bounds)
    entries = catalog.read(client, keys)
    unregistered: dict[str, int] = {}
    for handler in named:
        if handler not in runnable:
            unregistered[handler] = unregistered.get(handler, 0) + 1
    load_s = {e.name: e.mean_load_s for e in entries if e.loads}
    config = config or Config()
    forecasts = read_forecasts(client, keys, now_ms, config, load_s, arrivals)
    unread = [m for m in forecasts if m not in holders]
    if unread and config.scale_signal == "forecast":  # the forecast's warm hints weigh them
        pipe = client.pipeline(transaction=False)
        for m in unread:
            pipe.smembers(keys.holders(m))
        holders.update((m, frozenset(got) & ids) for m, got in zip(unread, pipe.execute()))
    return Snapshot(tuple(workers), backlogs, sizes, holders, load_s,
                    {e.name: e.vram_gb for e in entries if e.vram_gb > 0}, bands,
                    float(top[0][1]) if top else 0.0, unregistered, forecasts, dict(est_s or {}))


def forecast_settings(config: Config) -> forecast.Settings:
    return forecast.Settings(config.forecast_window_s, config.forecast_half_life_s,
                             config.forecast_day_s, config.forecast_lead_s)


def read_forecasts(client: redis.Redis, keys: Keys, now_ms: int, config: Config,
                   load_s: Mapping[str, float],
                   cache: dict[int, dict[str, int]] | None = None) -> dict[str, forecast.Forecast]:
    """Every model's forecast from the arrival buckets: one pipelined read of a bounded
    number of small hashes (the recent window, and a day and a week ago). cache: buckets
    read before, kept and reused once two buckets old (no enqueue writes them any more,
    one bucket of clock skew allowed), so a round reads the few new ones."""
    settings = forecast_settings(config)
    longest = max(load_s.values(), default=0.0) + settings.lead_s
    wanted = forecast.buckets_to_read(now_ms, settings, longest)
    cache = {} if cache is None else cache
    final = forecast.bucket_of(now_ms) - 1
    reads = [k for k in wanted if k not in cache]
    pipe = client.pipeline(transaction=False)
    for k in reads:
        pipe.hgetall(keys.arrivals(k))
    got = {k: {str(m): int(n) for m, n in fields.items()} for k, fields in zip(reads, pipe.execute())}
    buckets = {k: got[k] if k in got else cache[k] for k in wanted}
    keep = set(wanted)
    for k in [k for k in cache if k not in keep]:
        del cache[k]
    cache.update((k, v) for k, v in got.items() if k < final)
    return forecast.forecasts(buckets, now_ms, load_s, settings)


def _deepen(client: redis.Redis, keys: Keys, queues: list[tuple[int, str, int, list[Any]]]
            ) -> list[tuple[int, str, int, list[Any]]]:
    """The DEEP deepest queues' heads read on to SAMPLE tasks (the others keep SAMPLE_REST):
    a round's sample follows the backlog's work, and its cost stays bounded however many
    models have a deep queue (scripts/bench_scale.py: 25,000 task reads a round at 500
    models of 100 tasks)."""
    deep = sorted((i for i, q in enumerate(queues) if q[2] > SAMPLE_REST),
                  key=lambda i: (-queues[i][2], i))[:DEEP]
    if not deep:
        return queues
    pipe = client.pipeline(transaction=False)
    for i in deep:
        p, m, _, _ = queues[i]
        pipe.zrange(keys.queue(p, m), SAMPLE_REST, SAMPLE - 1, withscores=True)
    out = list(queues)
    for i, more in zip(deep, pipe.execute()):
        p, m, depth, head = out[i]
        out[i] = (p, m, depth, [*head, *more])
    return out


def _sample(client: redis.Redis, keys: Keys, queues: list[tuple[int, str, int, list[tuple[str, float]]]],
            bounds: list[float]) -> tuple[tuple[Backlog, ...], tuple[tuple[float, int], ...], list[str]]:
    """Each queue's backlog from its head tasks, the need bands, and the sampled tasks' handlers."""
    pipe = client.pipeline(transaction=False)
    for *_, head in queues:
        for tid, _ in head:
            pipe.hmget(keys.task(tid), "vram_gb", "est_s", "handler", "score")
    lower = "-inf"
    for bound in bounds:
        pipe.zcount(keys.need, lower, "+inf" if math.isinf(bound) else bound)
        lower = f"({bound}"
    replies = iter(pipe.execute())
    backlogs, named = [], []
    for p, m, depth, head in queues:
        got = [next(replies) for _ in head]
        # a task that ended between the reads has no hash left: it is just not sampled
        sample = tuple((_float(v), _float(e)) for v, e, _, _ in got if v is not None)
        named += [str(h) for v, _, h, _ in got if v is not None and h]
        # the head's start-by: its `score` (the queue's score is its fair order with tenants)
        start_by = _float(got[0][3]) if got and got[0][3] is not None else (
            float(head[0][1]) if head else math.inf)
        backlogs.append(Backlog(p, m, depth, start_by, sample))
    return tuple(backlogs), tuple(zip(bounds, (int(n) for n in replies))), named


class CommandHook:
    """Runs ``command class current desired`` (no shell) on a thread of its own, calls in
    order: a slow command must not hold up the reaper, whose lock would lapse meanwhile."""

    def __init__(self, command: str, timeout_s: float = HOOK_TIMEOUT_S) -> None:
        try:
            self.argv = shlex.split(command)
        except ValueError as exc:
            raise ConfigError(f"on_scale {command!r}: {exc}") from None
        if not self.argv:
            raise ConfigError("on_scale must name a command")
        self.timeout_s = timeout_s
        self.runner = ThreadPoolExecutor(1, thread_name_prefix="gpuq-scale-hook")
        self.last: Future[bool] | None = None

    def __call__(self, cls: str, current: int, desired: int,
                 env: Mapping[str, str] | None = None) -> None:
        self.last = self.runner.submit(self.run, cls, current, desired, env)

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until every call made so far has run (tests, orderly shutdown)."""
        if self.last is not None:
            self.last.result(timeout_s)

    def run(self, cls: str, current: int, desired: int, env: Mapping[str, str] | None = None) -> bool:
        """Run the command now (``env`` added to this process's environment); failures are
        logged, never raised."""
        argv = [*self.argv, cls, str(current), str(desired)]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=self.timeout_s, check=False,
                                  env={**os.environ, **env} if env else None)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("scale.hook_failed class=%s desired=%d error=%s", cls, desired, exc)
            return False
        if done.returncode != 0:
            log.warning("scale.hook_failed class=%s desired=%d rc=%d stderr=%s", cls, desired,
                        done.returncode, done.stderr.strip()[-500:])
        return done.returncode == 0


class Scaler:
    """Plans each round; remembers what the hook was told per class and when each model
    was last hinted (in memory: a new active reaper starts afresh)."""

    def __init__(self, client: redis.Redis, keys: Keys, config: Config,
                 hook: Hook | None = None) -> None:
        self.redis = client
        self.keys = keys
        self.config = config
        self.hook: Hook | None = hook
        if hook is None and config.on_scale:
            self.hook = CommandHook(config.on_scale)
        self.told: dict[str, int] = {}
        self.hinted: dict[str, int] = {}
        self.est_s: dict[str, float] = {}  # model -> mean est_s of its last sampled queue
        self.arrivals: dict[int, dict[str, int]] = {}  # arrival buckets no longer written

    def step(self, now_ms: int | None = None) -> ScalePlan:
        now = server_ms(self.redis) if now_ms is None else now_ms
        snapshot = read_snapshot(self.redis, self.keys, now, self.config, self.est_s, self.arrivals)
        result = plan(snapshot, self.config, now, self.hinted)
        for b in snapshot.backlogs:
            if b.sample:
                self.est_s[b.model] = sum(e for _, e in b.sample) / len(b.sample)
        self._write(result, now, snapshot.unregistered)
        self.hinted = {m: t for m, t in self.hinted.items() if now - t < HINT_EVERY_MS}
        self.hinted.update((h.model, now) for h in result.hints)
        for s in result.signals:
            if s.kind == "class":
                self._tell(s)
        return result

    def _write(self, result: ScalePlan, now_ms: int, unregistered: Mapping[str, int]) -> None:
        fields: dict[Any, Any] = {  # redis-py types a mapping's keys invariantly
            s.hash_field: json.dumps(s.fields(now_ms)) for s in result.signals}
        if result.unschedulable:
            fields["unschedulable"] = json.dumps({"tasks": result.unschedulable,
                                                  "largest_gb": result.largest_need_gb,
                                                  "class_gb": result.largest_class_gb})
        if unregistered:
            fields["unregistered"] = json.dumps(dict(sorted(unregistered.items())))
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.scale)
        if fields:
            pipe.hset(self.keys.scale, mapping=fields)
        for h in result.hints:
            pipe.lpush(self.keys.control(h.worker), h.message)
        if result.hints:
            pipe.hincrby(self.keys.stats, "warm_hints", len(result.hints))
        pipe.execute()
        for h in result.hints:
            log.info("scale.warm_hint pool=%s worker=%s model=%s vram_gb=%s", self.keys.pool,
                     h.worker, h.model, decimal(h.vram_gb))

    def _tell(self, s: ScaleSignal) -> None:
        if s.desired == self.told.setdefault(s.name, s.current):
            return
        self.told[s.name] = s.desired
        log.info("scale.signal pool=%s class=%s current=%d desired=%d reason=%s",
                 self.keys.pool, s.name, s.current, s.desired, s.reason)
        if self.hook is None:
            return
        try:
            if isinstance(self.hook, CommandHook):
                env = {"GPUQ_SCALE_REASON": s.reason}
                if s.forecast_per_s is not None:
                    env.update(GPUQ_RATE_PER_S=f"{s.rate_per_s or 0.0:.6g}",
                               GPUQ_FORECAST_PER_S=f"{s.forecast_per_s:.6g}")
                self.hook(s.name, s.current, s.desired, env)
            else:
                self.hook(s.name, s.current, s.desired)
        except Exception:  # a caller's hook must never stop the reaper
            log.exception("scale.hook_failed pool=%s class=%s", self.keys.pool, s.name)
