"""Scale planning: desired workers per model and GPU class, and warm hints, from a snapshot.

Pure functions over plain dataclasses (no Redis), so the rules are unit-tested directly;
``gpuq.reaper.scale`` reads the snapshot, writes the signals and runs the hook.
Per model with queued work (its queues summed over priorities):

- backlog n = the queues' ZCARD; work = Σ depth × mean ``est_s`` of the first ``SAMPLE`` tasks
  of each queue; need = the largest ``vram_gb`` and the most ``gpus`` among those samples that
  some registered class holds (the others are unschedulable and reported as such); late = a
  queue head is past its start-by. current = its live holders that serve a level its work is at.
- desired = enough workers to drain the work within ``scale_target_s``, where a holder drains
  the whole target and a new worker first loads the model (catalog mean load time, counted at
  most half the target, so slow loads still get workers); at least 1; at least current + 1
  when late and no idle worker serving that priority (and not skipping the model) fits it;
  at most n + current.
- Forecast (``scale_signal`` "forecast", the default; ``gpuq.reaper.forecast`` states the
  model): when a model's forecast rate F over the next horizon (its mean load time plus
  ``forecast_lead_s``) is a rise, desired = max(the above, ceil(F × mean est_s /
  ``forecast_utilisation``)), reason "forecast ...". A model with no queued work but a rise
  gets a signal too (desired = max(current, that need)). Mean est_s: its queues' sample,
  else what the scaler last sampled for it, else 1 s (enqueue's default).

Per GPU class (every registered class, and any class a live worker shows):

- current = its live workers (draining or retiring ones excluded: they take no new work).
- Each model's shortfall (desired − current, most urgent model first) is first met by idle
  workers that fit it (VRAM and GPUs), serve its priorities and do not skip it (its load
  failed there lately: gpuq.worker.broken), each idle worker once, tightest fit first; the
  rest goes to the smallest class that holds the model's need (least usable VRAM, then
  fewest GPUs, with at least its GPUs: ``gpuq.shapes.smallest_fit``), passing over classes
  whose live workers are all lanes serving none of its queued priorities
  (``gpuq.reaper.scale_classes.fit``).
- Queued tasks that fit no live worker but fit a class add at least 1 to the smallest such
  class (one-GPU tasks counted from the ``need`` index by VRAM bands, tasks over several GPUs
  from a sample of their ``need`` scores; not by reading tasks).
- Forecast: when the forecast work of the models whose smallest fit is a class rises
  (Σ F × est_s above Σ level × est_s), the class's desired is at least ceil(Σ F × est_s /
  ``forecast_utilisation`` − ``forecast_margin``): the class's expected load, not a worker
  per model (a worker serves several models; per-model ceilings would ask for a GPU per
  rising model), less a margin the live workers absorb (each new worker idles out its
  ``idle_timeout_s`` when the rise falls short).
- Forecast: a class whose live workers finish its queued work and the forecast arrivals'
  before a worker asked for now could start gets no workers for its model shortfalls
  (``gpuq.reaper.scale_ahead.calm_classes``).
- Desired never drops below current (idle workers retire by themselves, so an autoscaler never
  has to pick a victim); the pool's total is at least ``min_workers``, the difference going to
  the class with the most live workers, else to the largest class.

Warm hints: for a model with at least ``warm_backlog`` queued tasks whose holders have no free
slot, the tightest idle worker (not holding it, not skipping it, not reserved by the
preemption planner) whose idle score fits the need and whose levels serve at least
``warm_backlog`` of those tasks gets
``preload <model> <vram_gb>`` (the catalog footprint, else the need) on its control list. A
model is hinted at most once per ``HINT_EVERY_MS``, a worker at most once per step. Under the
forecast, idle workers left unhinted preload the models expected next
(``gpuq.reaper.scale_ahead.ahead_hints``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuq.config import Config
from gpuq.reaper import scale_classes
from gpuq.reaper.forecast import RISE, Forecast
from gpuq.reaper.scale_ahead import ahead_hints, calm_classes
from gpuq.reaper.snapshot import Snapshot, WorkerState, gpus_sampled
from gpuq.shapes import holds, smallest_fit

HINT_EVERY_MS = 30_000  # a model is hinted again only after this long


@dataclass(frozen=True)
class ScaleSignal:
    kind: str  # "class" or "model"
    name: str
    current: int
    desired: int
    reason: str
    rate_per_s: float | None = None  # arrivals now (decayed), summed over a class's models
    forecast_per_s: float | None = None  # and over the next horizon; None: no history

    @property
    def hash_field(self) -> str:
        return f"{self.kind}:{self.name}"

    def fields(self, at_ms: int, every_s: float) -> dict[str, object]:
        """The scale hash's JSON object (the forecast's rates only when there are some); `every_s`,
        the reaper's round interval, tells readers when the signal is stale."""
        out: dict[str, object] = {"current": self.current, "desired": self.desired,
                                  "reason": self.reason, "at": at_ms, "every_s": every_s}
        if self.forecast_per_s is not None:
            out["rate_per_s"] = round(self.rate_per_s or 0.0, 6)
            out["forecast_per_s"] = round(self.forecast_per_s, 6)
        return out


@dataclass(frozen=True)
class WarmHint:
    worker: str
    model: str
    vram_gb: float

    @property
    def message(self) -> str:
        return f"preload {self.model} {decimal(self.vram_gb)}"


@dataclass(frozen=True)
class ScalePlan:
    signals: list[ScaleSignal]
    hints: list[WarmHint]
    unschedulable: int = 0  # queued tasks larger than every class (none while no class is known)
    largest_need_gb: float = 0.0  # the largest of them
    largest_class_gb: float = 0.0
    largest_need_gpus: int = 1  # the GPUs the largest asks


@dataclass
class _Model:
    name: str
    depth: int = 0
    work_s: float = 0.0
    need_gb: float = 0.0
    need_gpus: int = 1
    by_level: dict[int, int] = field(default_factory=dict)
    late: set[int] = field(default_factory=set)


def decimal(x: float) -> str:
    return f"{x:.3f}".rstrip("0").rstrip(".")  # plain decimal, as the wire format wants


def _unqueued(name: str, snap: Snapshot) -> _Model:
    """A model with a forecast and no queued work, sized as its tasks were seen to ask (its
    weights, if more; none seen: one GPU): a 2-GPU model's arrivals must not be booked to
    the one-GPU class, nor a model no class holds to the smallest."""
    return _Model(name, need_gb=max(snap.footprint_gb.get(name, 0.0), snap.need_seen.get(name, 0.0)),
                  need_gpus=snap.gpus_seen.get(name, 1))


def _fits(w: WorkerState, m: _Model, levels: Iterable[int] | None = None) -> bool:
    """An idle worker with room for the model's need that serves one of its levels (or of
    ``levels``) and does not skip the model."""
    return (w.idle_gb or 0) >= m.need_gb and w.gpus >= m.need_gpus and m.name not in w.skips and any(
        map(w.serves, m.by_level if levels is None else levels))


def _spare(snap: Snapshot) -> list[WorkerState]:
    """Workers with a free slot that nothing else holds, tightest first."""
    free = [w for w in snap.workers if w.idle_gb is not None and not w.reserved]
    return sorted(free, key=lambda w: (w.idle_gb, w.id))


def _models(snap: Snapshot, now_ms: int) -> list[_Model]:
    """Backlogs summed per model, most urgent first (late, then most work)."""
    classes = [(gb, g) for _, gb, g in scale_classes.classes(snap)]
    out: dict[str, _Model] = {}
    needs: dict[str, list[tuple[float, int]]] = {}
    for b in snap.backlogs:
        m = out.setdefault(b.model, _Model(b.model))
        m.depth += b.depth
        m.by_level[b.priority] = m.by_level.get(b.priority, 0) + b.depth
        if b.sample:
            m.work_s += b.depth * sum(e for _, e, _ in b.sample) / len(b.sample)
        needs.setdefault(b.model, []).extend((v, g) for v, _, g in b.sample)
        if b.depth and b.head_ms < now_ms:
            m.late.add(b.priority)
    for m in out.values():
        seen = needs[m.name]
        # tasks no class holds are reported as unschedulable; they must not steer the rest
        held = [(v, g) for v, g in seen if holds(classes, v, g)] or seen
        m.need_gb, m.need_gpus = max((v for v, _ in held), default=0.0), max((g for _, g in held), default=1)
        if classes and not holds(classes, m.need_gb, m.need_gpus) and held is not seen:
            # tasks of several shapes no one class holds together: sized for its widest
            m.need_gpus = max(g for _, g in held)
            m.need_gb = max(v for v, g in held if g == m.need_gpus)
    # the index may name a queue that just emptied; a model whose tasks no registered class
    # holds is only reported as unschedulable (with no class yet, every model still counts)
    live = [m for m in out.values() if m.depth and (not classes or holds(classes, m.need_gb, m.need_gpus))]
    return sorted(live, key=lambda m: (not m.late, min(m.late, default=4), -m.work_s, m.name))


def _model_signal(m: _Model, current: int, load_s: float, config: Config,
                  idle_fit: bool) -> ScaleSignal:
    target = config.scale_target_s
    # a holder drains the whole target; a new worker loads first (counted at most half the
    # target, so a slow-loading model still gets workers when it is the only way through)
    cold_s = max(target - min(load_s, target / 2), 1e-3)
    desired = max(current + math.ceil(max(0.0, m.work_s - current * target) / cold_s), 1)
    reason = f"backlog {m.depth} tasks, {m.work_s:.0f} s of work"
    if m.late and not idle_fit:
        desired = max(desired, current + 1)
        reason = f"P{min(m.late)} past SLA, no idle fit; {reason}"
    return ScaleSignal("model", m.name, current, min(desired, m.depth + current), reason)


def _class_extra(snap: Snapshot, models: Sequence[_Model], holders: Mapping[str, set[str]],
                 signals: Sequence[ScaleSignal], calm: Mapping[str, str] | None = None
                 ) -> tuple[Counter[str], dict[str, list[str]]]:
    """Workers to add per class, and why: model shortfalls idle workers do not cover, and
    tasks that fit no live worker. calm: classes whose shortfalls the live workers absorb
    before a new worker could start (the forecast's check), and why."""
    classes = scale_classes.classes(snap)
    levels = scale_classes.class_levels(snap)
    spare = _spare(snap)
    extra: Counter[str] = Counter()
    why: dict[str, list[str]] = {}
    for m, sig in zip(models, signals):
        short = sig.desired - sig.current
        for w in list(spare) if short > 0 else ():
            if w.id not in holders[m.name] and _fits(w, m):
                spare.remove(w)  # an idle worker takes one model's work, not every model's
                short -= 1
                if short == 0:
                    break
        fit = scale_classes.fit(classes, m.need_gb, m.need_gpus, m.by_level, levels)
        if short > 0 and fit is not None:
            extra[fit] += short
            why.setdefault(fit, []).append(f"{m.name} +{short}: {sig.reason}")
    for c, reason in (calm or {}).items():
        if extra.pop(c, 0):
            why[c] = [reason]
    live = [(w.usable_gb, w.gpus) for w in snap.workers]
    running = {w.gpu for w in snap.workers}  # of equal shapes, a class with live workers
    live_max = max((gb for gb, _ in live), default=0.0)
    homeless: Counter[str] = Counter()
    lower = 0.0
    for bound, count in snap.need_bands:
        fit = smallest_fit(classes, bound, 1, running)
        if count and lower >= live_max and fit is not None:
            homeless[fit] += count
        lower = bound
    for gb, g in snap.wide:
        fit = smallest_fit(classes, gb, g, running)
        if fit is not None and not holds(live, gb, g):
            homeless[fit] += 1
    for c, count in homeless.items():
        extra[c] = max(extra[c], 1)
        why.setdefault(c, []).append(f"{count} tasks fit no live worker")
    return extra, why


def _est(m: _Model, snap: Snapshot) -> float:
    """A model's mean est_s: its queues' sample, else what was sampled before, else 1 s."""
    return m.work_s / m.depth if m.depth and m.work_s else snap.est_s.get(m.name, 1.0)


def _forecast_need(f: Forecast, est_s: float, config: Config) -> float:
    """Workers the forecast rate keeps busy at the target utilisation (not rounded)."""
    return f.forecast_per_s * est_s / max(config.forecast_utilisation, 1e-3)


def _with_forecast(sig: ScaleSignal, m: _Model, snap: Snapshot, config: Config) -> ScaleSignal:
    """A model's signal with its forecast: the rates, and desired raised for a rise."""
    f = snap.forecasts.get(m.name)
    if f is None:
        return sig
    desired, reason = sig.desired, sig.reason
    if f.rising and config.scale_signal == "forecast":
        need = math.ceil(_forecast_need(f, _est(m, snap), config) - 1e-9)
        if need > desired or not reason:
            desired = max(desired, need)
            reason = (f"forecast {f.forecast_per_s:.3g}/s in {f.horizon_s:.0f} s (now "
                      f"{f.level_per_s:.3g}/s): {need} workers" + (f"; {reason}" if reason else ""))
    return ScaleSignal("model", m.name, sig.current, max(desired, sig.current), reason,
                       f.level_per_s, f.forecast_per_s)


def _class_forecast(snap: Snapshot, config: Config, models: Sequence[_Model]
                    ) -> dict[str, tuple[float, float, float, float]]:
    """Per class, over the models whose smallest fit it is: Σ level, Σ forecast (per s), and
    Σ level × est_s, Σ forecast × est_s (their work, GPU-seconds per second)."""
    classes = scale_classes.classes(snap)
    out: dict[str, tuple[float, float, float, float]] = {}
    for m in models:
        f = snap.forecasts.get(m.name)
        fit = smallest_fit(classes, m.need_gb, m.need_gpus, {w.gpu for w in snap.workers})
        if f is None or fit is None:
            continue
        est = _est(m, snap)
        a, b, c, d = out.get(fit, (0.0, 0.0, 0.0, 0.0))
        out[fit] = (a + f.level_per_s, b + f.forecast_per_s, c + f.level_per_s * est,
                    d + f.forecast_per_s * est)
    return out


def _class_signals(snap: Snapshot, config: Config, extra: Counter[str], why: dict[str, list[str]],
                   ahead: Mapping[str, tuple[float, float, float, float]]) -> list[ScaleSignal]:
    sizes = scale_classes.sizes(snap)
    live = Counter(w.gpu for w in snap.workers)
    desired = {c: live[c] + extra[c] for c in sizes}
    for c, (_, rate, work_now, work) in ahead.items():
        need = math.ceil(work / max(config.forecast_utilisation, 1e-3) - max(config.forecast_margin, 1e-9))
        if (config.scale_signal == "forecast" and work > work_now * (1 + RISE)
                and need > desired[c]):
            desired[c] = need
            why.setdefault(c, []).insert(0, f"forecast {rate:.3g}/s, {work:.2f} GPU-s/s: {need} workers")
    gap = config.min_workers - sum(desired.values())
    if gap > 0 and sizes:
        pick = max(sizes, key=lambda c: (live[c], sizes[c], c))
        desired[pick] += gap
        why.setdefault(pick, []).append(f"min_workers {config.min_workers}")
    return [ScaleSignal("class", c, live[c], desired[c], "; ".join(why.get(c, [])) or "enough workers",
                        *(ahead[c][:2] if c in ahead else (None, None)))
            for c in sorted(sizes)]


def _hints(snap: Snapshot, config: Config, models: Sequence[_Model],
           holders: Mapping[str, set[str]], now_ms: int,
           recent: Mapping[str, int]) -> list[WarmHint]:
    spare = _spare(snap)
    spare_ids = {w.id for w in spare}
    wanted = max(config.warm_backlog, 1)
    out: list[WarmHint] = []
    used: set[str] = set()
    for m in models:
        if (m.depth < config.warm_backlog or now_ms - recent.get(m.name, -HINT_EVERY_MS) < HINT_EVERY_MS
                or not holders[m.name].isdisjoint(spare_ids)):
            continue  # small backlog, hinted lately, or a holder can take it now
        pick = next((w for w in spare if w.id not in used and w.id not in holders[m.name]
                     and _fits(w, m) and sum(n for p, n in m.by_level.items() if w.serves(p)) >= wanted),
                    None)
        if pick is not None:
            used.add(pick.id)
            out.append(WarmHint(pick.id, m.name, snap.footprint_gb.get(m.name) or m.need_gb))
    return out


def plan(snapshot: Snapshot, config: Config, now_ms: int,
         recent_hints: Mapping[str, int] | None = None) -> ScalePlan:
    """What the pool needs (pure). ``recent_hints``: model -> ms it was last hinted."""
    models = _models(snapshot, now_ms)
    live = {w.id for w in snapshot.workers}
    queued = {m.name for m in models}
    # models with a rise and no queued work: sized as their tasks were seen (_unqueued)
    rising = [_unqueued(name, snapshot) for name, f in snapshot.forecasts.items()
              if f.rising and name not in queued and config.scale_signal == "forecast"
              and (snapshot.weighed is None or name in snapshot.weighed)]
    by_id = {w.id: w for w in snapshot.workers}  # a lane holding a model drains only its levels' work
    holders = {m.name: {w for w in set(snapshot.holders.get(m.name, ())) & live if not m.by_level
                        or any(map(by_id[w].serves, m.by_level))} for m in models + rising}
    spare = _spare(snapshot)
    model_signals = []
    for m in models:  # late work fits an idle worker now if one serving a late level holds it
        idle_fit = any(_fits(w, m, m.late) for w in spare)
        model_signals.append(_model_signal(m, len(holders[m.name]), snapshot.load_s.get(m.name, 0.0),
                                           config, idle_fit))
    # the class's forecast covers every model with history, queued or not
    others = [_unqueued(name, snapshot) for name in snapshot.forecasts if name not in queued]
    ahead = _class_forecast(snapshot, config, models + others)
    calm: dict[str, str] = {}
    if config.scale_signal == "forecast":
        classes = scale_classes.classes(snapshot)
        levels = scale_classes.class_levels(snapshot)
        calm = calm_classes(Counter(w.gpu for w in snapshot.workers), [
            (scale_classes.fit(classes, m.need_gb, m.need_gpus, m.by_level, levels), m.work_s,
             snapshot.load_s.get(m.name, 0.0)) for m in models], {c: v[3] for c, v in ahead.items()},
            config.forecast_lead_s)
    extra, why = _class_extra(snapshot, models, holders, model_signals, calm)
    model_signals = [_with_forecast(sig, m, snapshot, config) for m, sig in zip(models, model_signals)]
    model_signals += [_with_forecast(ScaleSignal("model", m.name, len(holders[m.name]),
                                                 len(holders[m.name]), ""), m, snapshot, config)
                      for m in rising]
    signals = _class_signals(snapshot, config, extra, why, ahead) + model_signals
    hints = _hints(snapshot, config, models, holders, now_ms, recent_hints or {})
    if config.scale_signal == "forecast":
        recent = {**(recent_hints or {}), **{h.model: now_ms for h in hints}}
        held = {m: frozenset(ids) & live for m, ids in snapshot.holders.items()}
        # no lanes; none skipping a model either (rare: a forecast's preload may wait)
        full = [(w.id, w.usable_gb, w.gpus) for w in spare if (w.levels or "0123") == "0123" and not w.skips]
        hints += [WarmHint(w, m, gb) for w, m, gb in ahead_hints(
            full, held, snapshot.forecasts, snapshot.footprint_gb,
            config, now_ms, recent, HINT_EVERY_MS, {h.worker for h in hints}, snapshot.weighed,
            {**snapshot.gpus_seen, **gpus_sampled(snapshot)})]
    classes = scale_classes.classes(snapshot)
    shapes = [(gb, g) for _, gb, g in classes]
    wide = [(gb, g) for gb, g in snapshot.wide if not holds(shapes, gb, g)]
    over = sum(n for b, n in snapshot.need_bands if math.isinf(b))  # one-GPU tasks above every class
    unschedulable = over + len(wide) if classes else 0
    largest = max([(snapshot.largest_need_gb if over else 0.0, 1), *wide]) if unschedulable else (0.0, 1)
    return ScalePlan(signals, hints, unschedulable, largest[0],
                     max((gb for gb, _ in shapes), default=0.0), largest[1])
