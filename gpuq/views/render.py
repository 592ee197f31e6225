"""Plain-text rendering of pool views for the terminal."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpuq.redact import one_line
from gpuq.task import Priority, State
from gpuq.views.inspect import PoolView, WorkerView, scale_stale

ENDED = (State.SUCCEEDED, State.FAILED, State.EXPIRED, State.CANCELED)  # the ended line's order


def render_status(view: PoolView) -> str:
    parked = f" (and {view.parked} parked)" if view.parked else ""
    lines = [f"pool {view.pool}: {sum(q.depth for q in view.queues)} queued{parked}, {view.running} running, "
             f"{view.delayed} delayed, {view.waiting} waiting for parents, {view.schedules} schedules, "
             f"{len(view.workers)} workers, " + ("a reaper active" if view.reaper_active else "no reaper")]
    lines += [f"warning: {w}" for w in view.warnings]  # right under the header: they come first
    ended = ", ".join(f"{view.stats.get(s.value, 0)} {s.value}" for s in ENDED)
    lines.append(f"ended: {ended}" + (" (the latest: gpuq failures)" if view.stats.get("failed") else ""))
    lines.append("")
    lines.append(f"{'PRIORITY':<9}{'MODEL':<24}{'DEPTH':>8}{'OLDEST WAIT':>14}")
    for q in view.queues:
        lines.append(f"{q.priority:<9}{q.model[:23]:<24}{q.depth:>8}{q.oldest_wait_s:>13.1f}s")
    if not view.queues:
        lines.append("(no queued tasks)")
    lines += _sla(view.stats)
    if view.unschedulable:
        lines.append("")
        shapes = ", ".join(f"{gb:g} GB on {g} GPU{'s' if g > 1 else ''}" for gb, g in view.class_shapes)
        lines.append(f"unschedulable: {view.unschedulable} queued task(s) need more VRAM or GPUs than "
                     f"any registered GPU class holds (usable: {shapes or 'none'}): "
                     + ", ".join(view.unschedulable_ids[:5]))
    if view.parked:
        lines.append(f"parked: {view.parked} queued task(s) no live worker can hold (VRAM or GPUs), out "
                     "of their queues until one can")
    for handler, ids in view.unregistered.items():
        lines.append(f"no live worker runs handler {handler!r}: {len(ids)} queued task(s) near the "
                     f"queue heads: " + ", ".join(ids[:5]))
    lines.append("")
    lines.append(f"{'WORKER':<28}{'GPU':<18}{'VRAM FREE/TOTAL':>16}  {'STATE':<9}{'RUN':>4}  "
                 f"{'LEVELS':<7}MODELS")
    for w in view.workers:
        vram = f"{w.vram_free_gb:.0f}/{w.vram_total_gb:.0f} GB"
        state = w.state if w.alive else "dead?"
        lines.append(f"{w.id[:27]:<28}{w.gpu[:17]:<18}{vram:>16}  {state:<9}{len(w.running):>4}  "
                     f"{levels_label(w.levels):<7}{','.join(w.models) or '-'}")
    if not view.workers:
        lines.append("(no workers)")
    lines += _timeouts(view.workers)
    lines += (_preemption(view) + _scale(view.scale, view.scale_age_s) + _runtimes(view.runtimes)
              + _tenants(view.tenants, view.tenants_required))
    return "\n".join(map(one_line, lines))  # names are users' text: no terminal escape gets through


def _timeouts(workers: list[WorkerView]) -> list[str]:
    """Each bounded handler's ``timeout_s`` (handler_timeouts), a line each."""
    bounded = handler_timeouts(workers)
    if not bounded:
        return []
    lines = ["", "handler timeouts (timeout_s; past it a call fails its task, retryable):"]
    for handler, shown in bounded:
        lines.append(f"  {handler[:39]:<40}{timeouts_text(shown, ', ')}")
    return lines


def handler_timeouts(workers: list[WorkerView]) -> list[tuple[str, list[tuple[str, int]]]]:
    """Each bounded handler's ``timeout_s`` as the live workers' apps register it (status and
    top show them): its bounds ("30s"; "none": the handler without one), each with its count
    of live workers running the handler; several where they differ (two versions of an app
    deployed). By handler name."""
    live = [w for w in workers if w.alive]
    out = []
    for handler in sorted({h for w in live for h in w.timeouts}):
        seen = Counter(f"{w.timeouts[handler]:g}s" if handler in w.timeouts else "none"
                       for w in live if handler in w.timeouts or handler in w.handlers)
        out.append((handler, sorted(seen.items())))
    return out


def timeouts_text(bounds: list[tuple[str, int]], sep: str) -> str:
    """A handler's bounds (handler_timeouts): the bound alone where the workers agree."""
    if len(bounds) == 1:
        return bounds[0][0]
    return sep.join(f"{b} on {n} worker{'s' if n > 1 else ''}" for b, n in bounds)


def _tenants(tenants: list[dict[str, Any]], required: bool) -> list[str]:
    """Tenants: weight, running GPUs and VRAM against their caps, running tasks against the
    reaper's bound, queued tasks, SLA attainment at handler start."""
    if not tenants:
        return []
    lines = ["", "tenants" + (" (tasks of tenants not registered are refused)" if required else "")
             + ":", f"{'TENANT':<20}{'WEIGHT':>7}{'GPUS/CAP':>10}{'VRAM/CAP':>14}"
             f"{'TASKS/BOUND':>13}  {'QUEUED':<18}SLA AT START"]
    for t in tenants:
        name = t["name"] if t["registered"] else t["name"] + "*"
        queued = " ".join(f"{p}={n}" for p, n in sorted(t["queued"].items())) or "-"
        sla = " ".join(f"{p} {100 * s['met'] / (s['met'] + s['missed']):.1f}%"
                       for p, s in t["sla"].items() if s["met"] + s["missed"]) or "-"
        gpus = _of(t.get("running_gpus"), t["max_gpus"])
        vram = _of(t["running_vram_gb"], t["max_vram_gb"])
        bound = _of(t["running"], t.get("bound"))
        lines.append(f"{name[:19]:<20}{t['weight']:>7g}{gpus:>10}{vram:>14}{bound:>13}  "
                     f"{queued[:17]:<18}{sla}")
    if not all(t["registered"] for t in tenants):
        lines.append("* not registered: weight 1, no caps")
    if any(t.get("bound") is not None for t in tenants):
        lines.append("bound: running tasks the reaper allows while other tenants' recent demand "
                     "needs room")
    return lines


def _of(used: float | None, cap: float | None) -> str:
    return "-" if cap is None else f"{used or 0:g}/{cap:g}"


def _runtimes(runtimes: list[dict[str, Any]]) -> list[str]:
    """Run times learned from successful runs (the estimate of a task enqueued without one)."""
    if not runtimes:
        return []
    lines = ["", "run times learned from successful runs (most runs first):",
             f"{'HANDLER':<24}{'MODEL':<24}{'MEAN':>10}{'P90':>10}{'RUNS':>8}"]
    for r in runtimes:
        lines.append(f"{r['handler'][:23]:<24}{r['model'][:23]:<24}{_seconds(r['mean_s']):>10}"
                     f"{_seconds(r['p90_s']):>10}{r['samples']:>8}")
    return lines


def _seconds(x: float) -> str:
    """A run time without an exponent (a no-op's 4.5e-06 s reads 0.000s)."""
    return f"{x:.3f}s" if x < 100 else f"{x:.0f}s"


def _sla(stats: dict[str, int]) -> list[str]:
    """Attainment per priority: each task counted once, when its handler first started with
    its model loaded (a cold start's load counts against its SLA)."""
    shown = []
    for p in Priority:
        met, missed = stats.get(f"sla_met:{p.label}", 0), stats.get(f"sla_missed:{p.label}", 0)
        if met + missed:
            shown.append(f"{p.label} {attainment(met, missed)} ({met} met, {missed} missed)")
    return ["", "within SLA at handler start: " + ", ".join(shown)] if shown else []


def attainment(met: int, missed: int) -> str:
    if met + missed == 0:
        return "-"
    tenths = met * 1000 // (met + missed)  # floored: 100.0% only when nothing missed
    return f"{tenths // 10}.{tenths % 10}%"


def levels_label(levels: str) -> str:
    return "P" + levels if levels else "-"  # "P0123": the priorities a worker serves


def _preemption(view: PoolView) -> list[str]:
    lines = []
    if view.reservations:
        lines += ["", "reservations:"]
        lines += [f"  {r['worker']} held for {r['task']}" for r in view.reservations]
    if view.yield_requests:
        lines += ["", "yield requests:"]
        for y in view.yield_requests:
            left = float(y["yield_by_s"])
            when = f"within {left:.1f}s" if left >= 0 else f"overdue by {-left:.1f}s"
            lines.append(f"  {y['task']} on {y['worker']}: yield {when} for {y['for'] or '?'}")
    return lines


def _scale(scale: dict[str, dict[str, Any]], age_s: float | None = None) -> list[str]:
    signals = sorted((k for k in scale if ":" in k), key=lambda k: (not k.startswith("class:"), k))
    header = "scale signals:"
    if scale_stale(scale, age_s):  # no reaper rewrites them: say how old
        header = f"scale signals (stale: from a reaper round {age_s:.0f}s ago):"
    lines = ["", header] if scale else []
    for key in signals:
        s = scale[key]
        kind, _, name = key.partition(":")
        arrow = f"{s.get('current', '?')} -> {s.get('desired', '?')}"
        lines.append(f"  {kind:<6}{name[:23]:<24}{arrow:>10}  {s.get('reason', '')}")
    if "unschedulable" in scale:
        u = scale["unschedulable"]
        gb, gpus = u.get("largest_gb"), u.get("largest_gpus", 1)
        over = f" on {gpus} GPUs" if isinstance(gpus, int) and gpus > 1 else ""
        lines.append(f"  unschedulable: {u.get('tasks', '?')} task(s), the largest needs "
                     f"{gb:g} GB{over}" if isinstance(gb, (int, float)) else
                     f"  unschedulable: {u.get('tasks', '?')} task(s)")
    if "unregistered" in scale:
        named = ", ".join(f"{h} ({n})" for h, n in scale["unregistered"].items())
        lines.append(f"  handlers no live worker runs (sampled tasks): {named}")
    return lines
