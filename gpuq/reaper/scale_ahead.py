"""Planning ahead of demand (``scale_signal`` "forecast"): warm hints from the forecast, and
no new workers for a backlog the live ones finish first.

Pure functions over plain values from ``gpuq.reaper.scale_plan``'s snapshot, so the rules
are unit-tested directly; ``scale_plan.plan`` calls them only under the forecast signal.

**Forecast warm hints.** A worker that idles costs the same whether its VRAM holds the
models about to be asked for or not, and on a pool of one-slot GPUs most P0/P1 misses are
cold starts. So, most expected first: a model whose forecast expects at least one task per
recent window (``forecast_window_s``), whose catalog footprint is known and that no idle
worker holds (its next task would load it cold), gets ``preload <model> <footprint>`` on an
idle worker (not reserved, not hinted this step) where the load displaces nothing asked for:
either the worker's free VRAM (usable less the footprints of the models it holds) takes it,
or no model it holds has recent arrivals or a forecast (the worker evicts idle models least
recently used first, so each of them must be one nobody asks for). Room without eviction is
preferred, then the worker whose most asked-for model is asked for least. A model is hinted
at most once per ``HINT_EVERY_MS`` (as the backlog's hints). The forecast does not know a
model's priorities, so lane workers (``--priorities``) get none: their room is kept for the
levels they serve (``scale_plan.plan`` leaves them out).

**Calm classes.** A worker asked for now starts work only after the lead (``forecast_lead_s``,
the boot) and its first model load. When the class's live workers finish its queued work
plus the forecast arrivals' work within that time, the newcomer would find nothing left and
idle out its ``idle_timeout_s`` (billed all the while): the model shortfalls of such a class
ask for no worker (tasks no live worker fits still do). Its queued P0/P1 tasks have missed
their SLA already; a worker for the arrivals to come is the forecast's to ask for.

Measured: docs/BENCHMARKS.md, Autoscaling.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from gpuq.config import Config
from gpuq.reaper.forecast import Forecast


def held_by(holders: Mapping[str, frozenset[str] | set[str]]) -> dict[str, list[str]]:
    """Worker id -> the models it holds (of those whose holders were read)."""
    out: dict[str, list[str]] = {}
    for model, ids in sorted(holders.items()):
        for wid in ids:
            out.setdefault(wid, []).append(model)
    return out


def ahead_hints(spare: Sequence[tuple[str, float, int]], holders: Mapping[str, frozenset[str] | set[str]],
                forecasts: Mapping[str, Forecast], footprint_gb: Mapping[str, float], config: Config,
                now_ms: int, recent: Mapping[str, int], every_ms: int,
                used: set[str], weighed: Collection[str] | None = None,
                need_gpus: Mapping[str, int] | None = None) -> list[tuple[str, str, float]]:
    """(worker, model, footprint GB) to preload. spare: the idle workers that may take a
    hint, (id, usable GB, GPUs), tightest first; used: workers hinted this step (updated);
    weighed: the models whose holders were read, the only ones hinted (None: all);
    need_gpus: the GPUs a model's tasks were seen to ask (absent: 1): a worker with fewer
    could never run them."""
    window_s = max(config.forecast_window_s, 1.0)
    need_gpus = need_gpus or {}
    idle_ids = {wid for wid, *_ in spare}
    wanted = sorted((f for m, f in forecasts.items()
                     if f.forecast_per_s * window_s >= 1 and footprint_gb.get(m, 0.0) > 0
                     and not idle_ids & set(holders.get(m, ()))
                     and now_ms - recent.get(m, -every_ms) >= every_ms
                     and (weighed is None or m in weighed)),
                    key=lambda f: (-f.forecast_per_s, f.model))
    models_of = held_by(holders)
    out = []
    for f in wanted:
        gb = footprint_gb[f.model]
        best: tuple[int, float, int, int, str] | None = None
        for i, (wid, usable, gpus) in enumerate(spare):
            if wid in used or gb > usable or gpus < need_gpus.get(f.model, 1):
                continue
            held = models_of.get(wid, [])
            room = usable - sum(footprint_gb.get(m, 0.0) for m in held)
            hottest = max((_rate(forecasts, m) for m in held), default=0.0)
            if room < gb and hottest > 0:
                continue  # the load could displace a model that is asked for
            # the fewest GPUs, then the tightest (spare's order): a group stays for group work
            rank = (0 if room >= gb else 1, hottest, gpus, i, wid)
            if best is None or rank < best:
                best = rank
        if best is not None:
            used.add(best[-1])
            out.append((best[-1], f.model, gb))
    return out


def _rate(forecasts: Mapping[str, Forecast], model: str) -> float:
    f = forecasts.get(model)
    return 0.0 if f is None else max(f.forecast_per_s, f.level_per_s)


def drained(live: int, queued_s: float, forecast_work: float, reach_s: float) -> bool:
    """Whether the live workers finish the queued work and the forecast arrivals' work
    before a worker asked for now could start (``reach_s``: the lead plus a model load)."""
    return live > 0 and queued_s + forecast_work * reach_s <= live * reach_s


def calm_classes(live: Mapping[str, int], queued: Sequence[tuple[str | None, float, float]],
                 work_ahead: Mapping[str, float], lead_s: float) -> dict[str, str]:
    """Classes whose live workers finish their queued work and the forecast arrivals' before
    a new worker could start (``lead_s`` plus the queued models' mean load), and why.
    queued: (the model's smallest class, its queued work s, its mean load s) per model;
    work_ahead: class -> its forecast work (GPU-s per s)."""
    per_class: dict[str, list[tuple[float, float]]] = {}
    for c, work, load in queued:
        if c is not None:
            per_class.setdefault(c, []).append((work, load))
    out = {}
    for c, got in sorted(per_class.items()):
        work = sum(w for w, _ in got)
        reach = lead_s + sum(load for _, load in got) / len(got)
        if drained(live.get(c, 0), work, work_ahead.get(c, 0.0), reach):
            out[c] = f"backlog {work:.0f} s of work: the {live.get(c, 0)} live drain it within {reach:.0f} s"
    return out
