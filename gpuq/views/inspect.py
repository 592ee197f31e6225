"""Read-only views of a pool for ``gpuq status``, ``gpuq top`` and ``gpuq task`` (and the exporter)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from gpuq import catalog, tenants, work_index
from gpuq.clock import from_time_reply
from gpuq.keys import FAILURES_KEPT, Keys, live_reservation
from gpuq.shapes import gpus_of, unheld
from gpuq.task import TERMINAL_STATES, Priority, ended_count
from gpuq.worker_record import WorkerFields, WorkerRecord

HEADS = 20  # head tasks read per queue: the oldest wait, and handlers no live worker runs
OTHER = "other"  # pool_view(top=N): the model label of the queues past the N deepest, summed
RUNTIMES_SHOWN = 10  # learned run times shown: the pairs with the most runs
SHOWN = WorkerFields(("gpu_name", "vram_total_gb", "vram_free_gb", "models", "state", "levels",
                      "handlers", "gpus", "timeouts", "seen_at", "heartbeat_ms"))


@dataclass(frozen=True)
class QueueView:
    priority: str
    model: str
    depth: int
    oldest_wait_s: float


@dataclass(frozen=True)
class WorkerView:
    id: str
    gpu: str
    vram_total_gb: float
    vram_free_gb: float
    models: list[str]
    state: str
    running: list[str]
    alive: bool
    levels: str = ""  # priorities served, e.g. "0123"
    handlers: list[str] = field(default_factory=list)  # what its app runs
    gpus: int = 1  # devices in its group
    timeouts: dict[str, float] = field(default_factory=dict)  # its handlers' timeout_s bounds


@dataclass(frozen=True)
class PoolView:
    pool: str
    queues: list[QueueView]
    workers: list[WorkerView]
    running: int
    delayed: int
    unschedulable: int  # queued tasks no registered GPU class holds (VRAM, GPUs)
    unschedulable_ids: list[str]
    largest_gpu_gb: float
    stats: dict[str, int]
    # the registered classes' shapes, [usable GB, GPUs], most GPUs first (what unschedulable
    # tasks are weighed against)
    class_shapes: list[tuple[float, int]] = field(default_factory=list)
    # queued tasks out of their queues while no live worker can hold them (lua/park.lua)
    parked: int = 0
    models: list[dict[str, Any]] = field(default_factory=list)
    # live workers the preemption planner holds for a queued task: {"worker", "task"}
    reservations: list[dict[str, str]] = field(default_factory=list)
    # running tasks asked to give way: {"task", "worker", "yield_by_s" (from now; < 0: overdue),
    # "for" (the waiting task)}
    yield_requests: list[dict[str, Any]] = field(default_factory=list)
    scale: dict[str, dict[str, Any]] = field(default_factory=dict)  # the scale hash, parsed
    # handler -> queued task ids (among each queue's first HEADS) that name a handler no live
    # worker's app registers: no worker will run them until one that does joins
    unregistered: dict[str, list[str]] = field(default_factory=dict)
    # run times learned from successful runs, most runs first (RUNTIMES_SHOWN): {"handler",
    # "model", "mean_s", "p90_s", "samples"}
    runtimes: list[dict[str, Any]] = field(default_factory=list)
    # tenants registered or with tasks counted queued (gpuq.tenants.TenantState.to_dict), each
    # with "sla": {"P<n>": {"met", "missed"}} of its first handler starts; and whether the pool
    # refuses tenants not registered
    tenants: list[dict[str, Any]] = field(default_factory=list)
    tenants_required: bool = False
    # running tasks of live workers that reported progress (ctx.progress): task id ->
    # {"fraction", "message"}
    progress: dict[str, dict[str, Any]] = field(default_factory=dict)
    waiting: int = 0  # tasks waiting for their parents (enqueued with `after`)
    schedules: int = 0  # periodic tasks (gpuq schedule)
    warnings: list[str] = field(default_factory=list)  # about the server: gpuq status adds them
    reaper_active: bool = False  # a reaper holds the pool's lock
    # seconds since the newest scale signal was written (None: none carries a time): the hash
    # stays as the last active reaper left it
    scale_age_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pool_view(client: redis.Redis, keys: Keys, top: int | None = None) -> PoolView:
    """The pool as status, top and the exporter show it. top: per priority only the ``top``
    deepest queues in full, the rest as one row, model ``other`` (depth summed; oldest wait:
    the head of the one first in the level's index, the earliest start-by), their handlers
    not checked: a scrape of a 10,000-model pool reads a head per kept queue, not 20 per queue."""
    pipe = client.pipeline(transaction=False)
    pipe.time()  # the server's clock: the scripts wrote the scores and times read here
    for p in Priority:
        work_index.read_level(pipe, keys, p)
    pipe.zrange(keys.workers, 0, -1, withscores=True)
    pipe.zcard(keys.running)
    pipe.zcard(keys.delayed)
    pipe.hgetall(keys.classes)
    pipe.hgetall(keys.class_gpus)
    pipe.hgetall(keys.stats)
    pipe.hgetall(keys.scale)
    pipe.hgetall(keys.runtimes)  # at most 4096 pairs (lua/learn.lua)
    pipe.zcard(keys.waiting)
    pipe.hlen(keys.schedules)
    pipe.exists(keys.reaper_lock)
    (clock, *per_level, workers, running, delayed, classes, class_gpus, raw_stats, scale, runtimes,
     waiting, schedules, reaper) = pipe.execute()
    stats = counts(raw_stats)
    now = from_time_reply(clock) / 1000
    per_level = [work_index.models(r) for r in per_level]

    queues, named, parked = _queues(client, keys, per_level, now, top)

    shapes = [(gb, gpus_of(class_gpus.get(c))) for c, v in classes.items()
              if (gb := class_gb(v)) is not None]
    largest = max((gb for gb, _ in shapes), default=0.0)
    # with no class registered yet (producers before workers) no task is larger than one
    unschedulable_ids: list[str] = []
    unschedulable = 0
    if shapes:  # those still in their queues, then those parked out of them (lua/park.lua)
        ranges = unheld(shapes)
        pipe = client.pipeline(transaction=False)
        for key in (keys.need, keys.parked):
            for low, high in ranges:
                pipe.zrangebyscore(key, low, high, 0, 20)
                pipe.zcount(key, low, high)
        got = pipe.execute()
        unschedulable_ids = [str(i) for ids in got[::2] for i in ids][:20]
        unschedulable = sum(int(n) for n in got[1::2])

    views, reservations = _workers(client, keys, workers, now * 1000)
    runnable = {h for w in views if w.alive for h in w.handlers}
    unregistered: dict[str, list[str]] = {}
    for tid, handler in named:
        if handler not in runnable:
            unregistered.setdefault(handler, []).append(tid)
    return PoolView(
        pool=keys.pool, queues=queues, workers=views, running=int(running), delayed=int(delayed),
        unschedulable=int(unschedulable), unschedulable_ids=unschedulable_ids,
        largest_gpu_gb=largest, parked=int(parked),
        class_shapes=sorted(set(shapes), key=lambda s: (-s[1], -s[0])),
        # each end is counted per priority; a state's total, once there is one, is their sum (it
        # replaces a total a release before that kept)
        stats=stats | {s.value: n for s in TERMINAL_STATES if (n := ended_count(stats, s.value))},
        models=[asdict(e) for e in catalog.read(client, keys)], reservations=reservations,
        **_running_tasks(client, keys, [w for w in views if w.alive], now * 1000),
        scale={k: _parse_signal(v) for k, v in sorted(scale.items())},
        unregistered=dict(sorted(unregistered.items())), runtimes=learned_runtimes(runtimes),
        waiting=int(waiting), schedules=int(schedules), **_tenants(client, keys, stats),
        reaper_active=bool(reaper), scale_age_s=_scale_age(scale, now))


def counts(raw: dict[str, str]) -> dict[str, int]:
    """The `stats` hash's counters; a field that is not an integer (a foreign writer's) is
    left out, so status, top and the exporter still show the others."""
    out = {}
    for key, value in raw.items():
        try:
            out[str(key)] = int(value)
        except (TypeError, ValueError):
            continue
    return out


def number(value: Any) -> float | None:
    """A finite float from a stored field, or None: fields are written by scripts, workers
    and anyone with the pool's keys (a foreign or older writer: status, top and the exporter
    must still work)."""
    if isinstance(value, bool):
        return None
    try:
        result = float(value)
    except (TypeError, ValueError):
        return None
    return result if math.isfinite(result) else None


def class_gb(raw: str) -> float | None:
    """A ``classes`` entry's usable GB; None when not a finite number (an older worker
    declared nan or inf, which Redis refuses as a score bound)."""
    return number(raw)


def task_children(client: redis.Redis, keys: Keys, task_id: str) -> list[str]:
    """The tasks enqueued ``after`` this one while it had not ended (kept while it is readable)."""
    return sorted(str(c) for c in client.smembers(keys.children(task_id)))


def _tenants(client: redis.Redis, keys: Keys, stats: dict[str, int]) -> dict[str, Any]:
    states, required = tenants.read(client, keys)
    out = []
    for s in states:
        entry = s.to_dict()
        entry["sla"] = {p.label: {r: stats.get(f"sla_{r}:{p.label}:{s.tenant.name}", 0)
                                  for r in ("met", "missed")} for p in Priority}
        out.append(entry)
    return {"tenants": out, "tenants_required": required}


def parse_runtime(pair: str, value: str) -> dict[str, Any] | None:
    """One ``runtimes`` entry: "<handler> <model>" -> "<mean_s> <p90_s> <samples>"; None
    when malformed (a foreign writer must not break ``gpuq status``)."""
    handler, _, model = pair.partition(" ")
    parts = value.split(" ")
    try:
        mean, p90, samples = float(parts[0]), float(parts[1]), int(parts[2])
    except (ValueError, IndexError):
        return None
    if len(parts) != 3 or not model or not (math.isfinite(mean) and math.isfinite(p90)):
        return None
    return {"handler": handler, "model": model, "mean_s": mean, "p90_s": p90, "samples": samples}


def learned_runtimes(raw: dict[str, str], limit: int = RUNTIMES_SHOWN) -> list[dict[str, Any]]:
    """The ``runtimes`` hash's well-formed entries with the most samples, most first."""
    entries = [e for pair, value in raw.items() if (e := parse_runtime(pair, value))]
    entries.sort(key=lambda e: (-e["samples"], e["handler"], e["model"]))
    return entries[:limit]


def _queues(client: redis.Redis, keys: Keys, per_level: list[list[str]], now: float,
            top: int | None) -> tuple[list[QueueView], list[tuple[str, str]], int]:
    """Each queue's depth and oldest wait (pool_view's ``top``), the (task id, handler) of
    the head tasks read, and the parked tasks' count."""
    pairs = [(p, m) for p, models in zip(Priority, per_level) for m in models]
    def counts(atomic: bool) -> list[int]:
        pipe = client.pipeline(transaction=atomic)
        for p, m in pairs:
            pipe.zcard(keys.queue(p, m))
        pipe.zcard(keys.parked)
        return [int(n) for n in pipe.execute()]

    try:  # one MULTI with `parked`: a task the park pass moves between the reads is counted once
        *depth_of, parked = counts(True)
    except redis.OutOfMemoryError:  # a full server refuses whatever a MULTI queues, reads too,
        *depth_of, parked = counts(False)  # and a full pool is when its view is needed
    depths = dict(zip(pairs, depth_of))
    rows: list[tuple[Priority, str, list[tuple[Priority, str]]]] = []  # level, model, queues
    for p, models in zip(Priority, per_level):
        level = [(p, m) for m in models]  # index order: the earliest head start-by first
        # a model named "other" joins the summed row: two series of one label set would clash
        kept = level if top is None else sorted((q for q in level if q[1] != OTHER),
                                                key=lambda q: -depths[q])[:top]
        rows += [(p, m, [(p, m)]) for p, m in kept]
        shown = set(kept)
        if rest := [q for q in level if q not in shown]:
            rows.append((p, OTHER, rest))
    heads = HEADS if top is None else 1
    pipe = client.pipeline(transaction=False)
    for _, _, qs in rows:
        pipe.zrange(keys.queue(*qs[0]), 0, heads - 1)
    ids_of = pipe.execute()
    pipe = client.pipeline(transaction=False)
    for ids in ids_of:
        for tid in ids:
            pipe.hmget(keys.task(tid), "queued_at", "handler")  # since it last became queued
    read = iter(pipe.execute())
    queues, named = [], []
    for (p, m, qs), ids in zip(rows, ids_of):
        fields = [next(read) for _ in ids]
        at = number(fields[0][0]) if fields else None  # a foreign write: no wait shown
        wait = max(0.0, now - at / 1000) if at is not None else 0.0
        queues.append(QueueView(p.label, m, sum(depths[q] for q in qs), round(wait, 3)))
        if top is None:
            named += [(tid, h) for tid, (_, h) in zip(ids, fields) if h]
    return queues, named, int(parked)


def _workers(client: redis.Redis, keys: Keys, workers: list[tuple[str, float]],
             now_ms: float) -> tuple[list[WorkerView], list[dict[str, str]]]:
    """Each worker's view, and the reservations of the live ones."""
    pipe = client.pipeline(transaction=False)
    for wid, _ in workers:
        SHOWN.read(pipe, keys, wid)
        pipe.smembers(keys.worker_tasks(wid))
        pipe.get(keys.reservation(wid))
    replies = pipe.execute()
    views, reservations = [], []
    for (wid, expiry), info, tasks, reserved in zip(workers, *(replies[i::3] for i in range(3))):
        alive = expiry >= now_ms
        record = SHOWN.record(wid, info)
        w = record or WorkerRecord(wid)  # no hash (being reaped): nothing known but its id
        views.append(WorkerView(
            id=wid, gpu=w.gpu_name, vram_total_gb=w.vram_total_gb, vram_free_gb=w.vram_free_gb,
            models=list(w.models),  # busy/idle below from the live task set, not the last beat's
            state="silent" if alive and w.silent(now_ms) else "draining" if w.state == "draining"
            else "busy" if tasks else "idle",
            running=sorted(tasks), alive=alive, levels=w.levels if record else "",
            handlers=list(w.handlers), gpus=w.gpus, timeouts=dict(w.timeouts)))
        live = live_reservation(reserved, int(now_ms))
        if alive and live:
            reservations.append({"worker": wid, "task": live[0]})
    return views, reservations


def _running_tasks(client: redis.Redis, keys: Keys, live: list[WorkerView],
                   now_ms: float) -> dict[str, Any]:
    """The running tasks' yield requests and progress reports (one HMGET each)."""
    running = [(w.id, t) for w in live for t in w.running]
    pipe = client.pipeline(transaction=False)
    for _, task_id in running:
        pipe.hmget(keys.task(task_id), "yield_by", "yield_for", "progress", "progress_msg")
    requests, progress = [], {}
    for (wid, task_id), (by, waiting, fraction, message) in zip(running, pipe.execute()):
        if (by_ms := number(by)) is not None:
            requests.append({"task": task_id, "worker": wid,
                             "yield_by_s": round((by_ms - now_ms) / 1000, 3),
                             "for": waiting or ""})
        if (value := _fraction(fraction)) is not None:
            progress[task_id] = {"fraction": value, "message": message or ""}
    return {"yield_requests": requests, "progress": progress}


def _fraction(text: str | None) -> float | None:
    """A stored progress fraction, or None (none, or not a number from 0 to 1)."""
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return value if value is not None and 0 <= value <= 1 else None


STALE_SCALE_S = 15.0  # rounds come every second; a standby takes over within 10 s


def scale_stale_after_s(scale: dict[str, dict[str, Any]]) -> float:
    """The age past which the scale signals are from a round too old for any reaper to be
    rewriting them: a reaper whose rounds are slower (each signal's `every_s`) is given
    three of them."""
    every = [e for v in scale.values() if isinstance(e := v.get("every_s"), (int, float))
             and not isinstance(e, bool)]
    return max(STALE_SCALE_S, 3 * max(every, default=0.0))


def scale_stale(scale: dict[str, dict[str, Any]], age_s: float | None) -> bool:
    """Whether the scale signals are stale (``PoolView.scale_age_s``; None, no signal with a
    time: not known to be stale)."""
    return age_s is not None and age_s > scale_stale_after_s(scale)


def _scale_age(scale: dict[Any, Any], now_s: float) -> float | None:
    """Seconds since the newest signal's round (its `at`, server ms), None if none has one."""
    ats = [at for v in scale.values() if isinstance(at := _parse_signal(v).get("at"), (int, float))
           and not isinstance(at, bool)]
    return max(0.0, now_s - max(ats) / 1000) if ats else None


def _parse_signal(raw: str) -> dict[str, Any]:
    # the hash is written by the reaper, but a foreign writer must not break `gpuq status`
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"raw": raw}


def recent_misses(client: redis.Redis, keys: Keys, limit: int = 50) -> list[dict[str, Any]]:
    """The latest SLA misses as stored (newest first): {"id", "priority", "model", "wait_s",
    "at" (epoch s), "kind": "late" (started, or a warm hand-over taken up, after its
    start-by time), "cold" (started in time, its handler late after the model load) or "expired"}."""
    return _recent(client, keys.sla_misses, limit)


def recent_failures(client: redis.Redis, keys: Keys, limit: int = FAILURES_KEPT) -> list[dict[str, Any]]:
    """The latest tasks that ended failed, as stored (newest first): {"id", "handler",
    "model", "priority", "tenant", "attempt", "error" (its first 200 bytes), "at" (epoch s,
    a float even on a whole second, where the script's JSON writes an integer)}."""
    out = _recent(client, keys.failures, limit)
    for entry in out:
        if isinstance(at := entry.get("at"), int) and not isinstance(at, bool):
            entry["at"] = float(at)
    return out


def _recent(client: redis.Redis, key: str, limit: int) -> list[dict[str, Any]]:
    """A capped list's first ``limit`` JSON objects. Elements that are not JSON objects are
    skipped: the list is capped, not validated, and a foreign writer must not break the
    views that read it."""
    out = []
    for raw in client.lrange(key, 0, limit - 1) if limit > 0 else []:
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out
