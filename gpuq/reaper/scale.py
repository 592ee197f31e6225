"""Scale-up signals and warm hints: what the pool needs, computed once per reaper round.

``Scaler.step`` reads a bounded snapshot of the pool (``read_snapshot``), plans from it with
the pure ``gpuq.reaper.scale_plan.plan`` (its docstring states the rules), then in one MULTI
replaces the ``scale`` hash, pushes the warm hints and counts them, and finally tells the hook
about classes whose desired count changed.

The ``scale`` hash: ``class:<gpu>`` and ``model:<name>`` -> JSON {current, desired, reason, at,
and, with arrival history, rate_per_s and forecast_per_s (``gpuq.reaper.forecast``; a class's
are summed over the models whose smallest fit it is)};
``unschedulable`` -> JSON {tasks, largest_gb (the largest need), largest_gpus (its GPUs),
class_gb (the largest class)}
while queued tasks exceed every class; ``unregistered`` -> JSON {handler: tasks} while sampled
queued tasks name a handler that no live worker's app registers (no GPU class fixes those:
a worker running that app does). The hook gets (class, current, desired) when a class's
desired differs from what it was last told (first sight: from current); a command hook also
gets GPUQ_SCALE_REASON and, with history, GPUQ_RATE_PER_S and GPUQ_FORECAST_PER_S in its
environment (arguments stay three, so existing hooks keep working).
"""

from __future__ import annotations

import heapq
import json
import logging
import math
from collections.abc import Callable, Mapping
from itertools import repeat
from typing import Any

import redis

from gpuq import catalog, shapes, tenants, work_index
from gpuq.clock import server_ms
from gpuq.config import Config
from gpuq.keys import ARRIVAL_TTL_S, Keys, live_reservation
from gpuq.reaper import forecast
from gpuq.reaper.backlog_sample import SAMPLE_REST, Samples, as_float, deepen, read_backlogs
from gpuq.reaper.known_workers import KnownWorkers
from gpuq.reaper.scale_hook import CommandHook
from gpuq.reaper.scale_plan import HINT_EVERY_MS, ScalePlan, ScaleSignal, decimal, plan
from gpuq.reaper.snapshot import Snapshot, WorkerState, gpus_sampled, need_sampled
from gpuq.task import Priority
from gpuq.worker_record import AWAY, lane_skips

log = logging.getLogger(__name__)
HINT_TTL_MS = 60_000  # a live worker reads its control list at once; a hint is advisory

Hook = Callable[[str, int, int], None]  # (GPU class, current, desired)

MODELS_PER_LEVEL = 500  # bounds the read even if producers invent models without end


def read_snapshot(client: redis.Redis, keys: Keys, now_ms: int, config: Config | None = None,
                  est_s: Mapping[str, float] | None = None,
                  arrivals: dict[int, dict[str, int]] | None = None,
                  samples: Samples | None = None,
                  entries: list[catalog.ModelEntry] | None = None,
                  known: KnownWorkers | None = None,
                  gpus_seen: Mapping[str, int] | None = None,
                  need_seen: Mapping[str, float] | None = None) -> Snapshot:
    """The pool as ``plan`` needs it, in five pipelined reads (and the catalog's two), each
    bounded: per queue its ZCARD and SAMPLE_REST head tasks (SAMPLE for the DEEP deepest;
    at most SAMPLE_BUDGET task reads in all, ``Samples``), per live worker a few hash
    fields, the ``need`` index counted by VRAM bands, the arrival buckets the forecast reads,
    the holders of the queued models and of at most MODELS_PER_LEVEL others with a forecast.
    est_s: the mean est_s last sampled per model, arrivals: the buckets read before,
    samples: each queue's last sample, known: the live workers' fixed fields (the scaler's
    memory; see ``read_forecasts``); entries: the model catalog, if the caller read it
    this round."""
    pipe = client.pipeline(transaction=False)
    for level in Priority:
        work_index.read_level(pipe, keys, level, 0, MODELS_PER_LEVEL)
    pipe.zrangebyscore(keys.workers, now_ms, "+inf", withscores=True)
    pipe.zrange(keys.idle, 0, -1, withscores=True)
    pipe.hgetall(keys.classes)
    pipe.hgetall(keys.class_gpus)
    for key in (keys.need, keys.parked):  # the largest one-GPU need; parked: need's share out of queues
        pipe.zrevrangebyscore(key, f"({2 * shapes.WIDE!r}", "-inf", 0, 1, withscores=True)
    pipe.exists(keys.tenants)
    pipe.hget(keys.fairness, "reserved_until")
    pipe.hgetall(keys.lanes)  # lanes are few, skips rarer: cheaper than an idle worker's each
    *per_level, leases, idle, classes, class_gpus, top, parked_top, tenancy, gate, lanes = pipe.execute()
    live = [str(w) for w, _ in leases]
    top = max(top + parked_top, key=lambda pair: float(pair[1]), default=None)
    held_back = tenants.at_limit(tenants.read(client, keys)[0]) if tenancy else frozenset()
    pairs = [(int(p), m) for p, got in zip(Priority, per_level) for m in work_index.models(got)]
    models = sorted({m for _, m in pairs})
    pipe = client.pipeline(transaction=False)
    known = KnownWorkers() if known is None else known
    known.read(pipe, keys, live, {str(w): float(t) for w, t in leases})
    # the claims' gate (lib/gates.lua) is at or past every reservation's expiry: at or before
    # now none is live, and the workers' reservation keys are not read (as a claim reads none)
    reserving = bool(live) and as_float(gate) > now_ms
    if reserving:  # one command for every worker's reservation
        pipe.mget([keys.reservation(wid) for wid in live])
    for p, m in pairs:
        pipe.zcard(keys.queue(p, m))
        pipe.zrange(keys.queue(p, m), 0, SAMPLE_REST - 1, withscores=True)
    for m in models:
        pipe.smembers(keys.holders(m))
    replies = iter(pipe.execute())
    idle_gb = {str(w): float(score) for w, score in idle}
    workers = []
    runnable: set[str] = set()  # handlers the live workers' apps register
    records = known.records(client, keys, live, replies)
    for wid, record, reserved in zip(live, records, next(replies) if reserving else repeat(None)):
        if record is None:  # no hash: being reaped
            continue
        runnable.update(record.handlers)
        if record.state not in AWAY:
            workers.append(WorkerState(wid, record.gpu_name, record.usable_gb, record.levels,
                                       idle_gb.get(wid), live_reservation(reserved, now_ms) is not None,
                                       record.gpus, frozenset(lane_skips(lanes.get(wid), now_ms))
                                       if wid in idle_gb else frozenset()))
    queues = [(p, m, int(next(replies)), next(replies)) for p, m in pairs]
    ids = {w.id for w in workers}
    holders = {m: frozenset(next(replies)) & ids for m in models}
    # a size that is no finite number (an older worker declared nan or inf) is no class: a
    # score bound of nan would fail the round's reads
    sizes = {str(c): gb for c, v in classes.items() if math.isfinite(gb := as_float(v))}
    bounds = [*sorted(b for b in set(sizes.values()) | {w.usable_gb for w in workers}
                      if math.isfinite(b)), math.inf]
    samples = Samples() if samples is None else samples
    reads = samples.reads([(p, m, depth) for p, m, depth, _ in queues])
    read, bands, named, wide = read_backlogs(client, keys, deepen(client, keys, queues, reads), reads,
                                             bounds, held_back, samples.rows)
    backlogs = samples.fill(read, now_ms)  # queues not read in full: their kept sample
    entries = catalog.read(client, keys) if entries is None else entries
    unregistered: dict[str, int] = {}
    for handler in named:
        if handler not in runnable:
            unregistered[handler] = unregistered.get(handler, 0) + 1
    load_s = {e.name: e.mean_load_s for e in entries if e.loads}
    config = config or Config()
    forecasts = read_forecasts(client, keys, now_ms, config, load_s, arrivals)
    # the forecast's warm hints and rising signals weigh holders: read for the models rising
    # first, then the fastest arriving, MODELS_PER_LEVEL of them at most (a read a model)
    unread = heapq.nsmallest(MODELS_PER_LEVEL, (m for m in forecasts if m not in holders),
                             key=lambda m: (not forecasts[m].rising, -forecasts[m].forecast_per_s, m)
                             ) if config.scale_signal == "forecast" else []
    if unread:
        pipe = client.pipeline(transaction=False)
        for m in unread:
            pipe.smembers(keys.holders(m))
        holders.update((m, frozenset(got) & ids) for m, got in zip(unread, pipe.execute()))
    gpus = {str(c): shapes.gpus_of(n) for c, n in class_gpus.items()}
    return Snapshot(tuple(workers), backlogs, sizes, holders, load_s,
                    {e.name: e.vram_gb for e in entries if e.vram_gb > 0}, bands,
                    float(top[1]) if top else 0.0, unregistered, forecasts, dict(est_s or {}),
                    frozenset(holders), gpus, wide, widest(gpus_seen or {}, entries), dict(need_seen or {}))


def widest(gpus_seen: Mapping[str, int], entries: list[catalog.ModelEntry]) -> dict[str, int]:
    """Per model, the most GPUs its tasks were seen to ask: in a queue's sample, or by the
    task whose claim last loaded it (the catalog): a model whose tasks ran at once on a group,
    never sampled in a queue, is still no model to preload on fewer GPUs."""
    out = dict(gpus_seen)
    for e in entries:
        if e.gpus > out.get(e.name, 1):
            out[e.name] = e.gpus
    return out


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
    # a count gpuq never wrote (not a whole number) is left out, not the step
    got = {k: {str(m): int(n) for m, n in fields.items() if str(n).isdigit()}
           for k, fields in zip(reads, pipe.execute())}
    buckets = {k: got[k] if k in got else cache[k] for k in wanted}
    keep = set(wanted)
    for k in [k for k in cache if k not in keep]:
        del cache[k]
    cache.update((k, v) for k, v in got.items() if k < final)
    return forecast.forecasts(buckets, now_ms, load_s, settings)


class Scaler:
    """Plans each round; remembers what the hook was told per class and when each model
    was last hinted (in memory: a new active reaper, or one active again after a standby,
    starts afresh: ``forget``)."""

    def __init__(self, client: redis.Redis, keys: Keys, config: Config,
                 hook: Hook | None = None) -> None:
        self.redis = client
        self.keys = keys
        self.config = config
        self.hook: Hook | None = hook
        if hook is None and config.on_scale:
            self.hook = CommandHook(config.on_scale)
        self.told: dict[str, int] = {}
        self.told_current: dict[str, int] = {}  # class -> its live count at the last step
        self.hinted: dict[str, int] = {}
        self.est_s: dict[str, float] = {}  # model -> mean est_s of its last sampled queue
        self.gpus_seen: dict[str, int] = {}  # model -> the most GPUs its sampled tasks asked
        self.need_seen: dict[str, float] = {}  # model -> the most VRAM its sampled tasks asked
        self.est_seen: dict[str, int] = {}  # model -> when (ms) it last had work or arrivals
        self.samples = Samples()  # each queue's last full sample (a round's reads are bounded)
        self.known = KnownWorkers()  # live workers' fields that do not change while they run
        # the last step's live workers that take work, as (usable GB, GPUs): what the park
        # pass weighs (lua/park.lua); None before the first step
        self.live_classes: list[tuple[float, int]] | None = None
        self.arrivals: dict[int, dict[str, int]] = {}  # arrival buckets no longer written
        self.catalog = catalog.CatalogPages()  # a page of it a round (the reaper's too)

    def forget(self) -> None:
        """Another reaper may have told the hook other counts meanwhile."""
        self.told.clear()
        self.told_current.clear()
        self.hinted.clear()

    def step(self, now_ms: int | None = None,
             entries: list[catalog.ModelEntry] | None = None) -> ScalePlan:
        """entries: the model catalog, if the round read it already (else a page of it)."""
        now = server_ms(self.redis) if now_ms is None else now_ms
        entries = self.catalog.read(self.redis, self.keys) if entries is None else entries
        snapshot = read_snapshot(self.redis, self.keys, now, self.config, self.est_s, self.arrivals,
                                 self.samples, entries, self.known, self.gpus_seen, self.need_seen)
        result = plan(snapshot, self.config, now, self.hinted)
        # a worker hash damaged by hand (a size below its reserve, not a number) is no shape
        self.live_classes = sorted({(w.usable_gb, w.gpus) for w in snapshot.workers
                                    if 0 <= w.usable_gb <= 1e9 and 1 <= w.gpus <= 64})
        self.gpus_seen = {**self.gpus_seen, **gpus_sampled(snapshot)}
        self.need_seen = {**self.need_seen, **need_sampled(snapshot)}
        for b in snapshot.backlogs:
            if b.sample:
                self.est_s[b.model] = sum(e for _, e, _ in b.sample) / len(b.sample)
        # kept while the arrival buckets a forecast reads may name the model (a season ago),
        # then forgotten: a pool's models come and go, and this is copied into every snapshot
        self.est_seen.update((m, now) for m in {b.model for b in snapshot.backlogs if b.depth}
                             | set(snapshot.forecasts))
        self.est_seen = {m: t for m, t in self.est_seen.items() if now - t <= ARRIVAL_TTL_S * 1000}
        self.est_s = {m: e for m, e in self.est_s.items() if m in self.est_seen}
        self.gpus_seen = {m: g for m, g in self.gpus_seen.items() if m in self.est_seen}
        self.need_seen = {m: g for m, g in self.need_seen.items() if m in self.est_seen}
        self._write(result, now, snapshot.unregistered)
        self.hinted = {m: t for m, t in self.hinted.items() if now - t < HINT_EVERY_MS}
        self.hinted.update((h.model, now) for h in result.hints)
        for s in result.signals:
            if s.kind == "class":
                self._tell(s)
        return result

    def _write(self, result: ScalePlan, now_ms: int, unregistered: Mapping[str, int]) -> None:
        fields: dict[Any, Any] = {  # redis-py types a mapping's keys invariantly
            s.hash_field: json.dumps(s.fields(now_ms, self.config.reap_interval_s)) for s in result.signals}
        if result.unschedulable:
            fields["unschedulable"] = json.dumps({"tasks": result.unschedulable,
                                                  "largest_gb": result.largest_need_gb,
                                                  "largest_gpus": result.largest_need_gpus,
                                                  "class_gb": result.largest_class_gb})
        if unregistered:
            fields["unregistered"] = json.dumps(dict(sorted(unregistered.items())))
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.scale)
        if fields:
            pipe.hset(self.keys.scale, mapping=fields)
        for h in result.hints:
            pipe.lpush(self.keys.control(h.worker), h.message)
            # a worker that left since the snapshot was read never deletes the list it recreated
            pipe.pexpire(self.keys.control(h.worker), HINT_TTL_MS)
        if result.hints:
            pipe.hincrby(self.keys.stats, "warm_hints", len(result.hints))
        pipe.execute()
        for h in result.hints:
            log.info("scale.warm_hint pool=%s worker=%s model=%s vram_gb=%s", self.keys.pool,
                     h.worker, h.model, decimal(h.vram_gb))

    def _tell(self, s: ScaleSignal) -> None:
        told = self.told.setdefault(s.name, s.current)
        # a class whose count fell short of what it was told (a worker died or left): told
        # again, or an autoscaler that sets its count from these calls replaces no one
        short = s.current < self.told_current.get(s.name, s.current) and s.current < s.desired
        self.told_current[s.name] = s.current
        if s.desired == told and not short and not (isinstance(self.hook, CommandHook)
                                                    and self.hook.due_again(s.name)):
            return
        self.told[s.name] = s.desired
        log.info("scale.signal pool=%s class=%s current=%d desired=%d reason=%s%s",
                 self.keys.pool, s.name, s.current, s.desired, s.reason,
                 "" if s.desired != told else " (told again: fewer live workers)" if short
                 else " (told again: the hook's last call failed)")
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
