"""The figures of a simulation run, as one JSON-able object and as a text table."""

from __future__ import annotations

from typing import Any

from gpuq.metrics import PREEMPTION_KINDS
from gpuq.report import percentile
from gpuq.sim.model import SimResult

# the engine counts what the planner decided and what the GPUs did; a yield request
# withdrawn before it was honoured is not counted, so not reported
COUNTED_KINDS = tuple(k for k in PREEMPTION_KINDS if k != "withdrawn")


def summarize(result: SimResult) -> dict[str, Any]:
    """The report object: per priority, then per pool (keys as ``gpuq simulate --json``)."""
    priorities: dict[str, Any] = {}
    for p in range(4):
        tasks = [t for t in result.tasks if t.priority == p]
        waits = [t.start_s - t.arrival_s for t in tasks if t.start_s is not None]
        sla = result.sla_s[p]
        met = sum(1 for t in tasks if t.start_s is not None and t.start_s - t.arrival_s <= (sla or 0))
        priorities[f"P{p}"] = {
            "tasks": len(tasks),
            "sla_s": sla,
            # every task counts: one that never started (expired, unfinished) missed its SLA
            "sla_attainment": round(met / len(tasks), 4) if tasks and sla is not None else None,
            "wait_p50_s": _round(percentile(waits, 0.50)),
            "wait_p99_s": _round(percentile(waits, 0.99)),
            "expired": sum(1 for t in tasks if t.outcome == "expired"),
            # claimed in time or not, some attempt of these first waited for a model load
            "cold_starts": sum(1 for t in tasks if t.cold_load),
        }
    done = [t for t in result.tasks if t.outcome == "succeeded"]
    gpus = len(result.gpus)
    busy, loading = sum(result.busy_s.values()), sum(result.loading_s.values())
    capacity = gpus * result.makespan_s
    return {
        "policy": result.policy,
        "speedup": result.speedup,
        "gpus": [gb for _, gb in result.gpus],
        "priorities": priorities,
        # busy = loading + running; the split shows whether busy time was useful work
        "gpu_busy_fraction": round(busy / capacity, 4) if capacity else 0.0,
        "gpu_loading_fraction": round(loading / capacity, 4) if capacity else 0.0,
        "gpu_running_fraction": round((busy - loading) / capacity, 4) if capacity else 0.0,
        "model_loads": result.model_loads,
        "preemptions": {k: result.preemptions.get(k, 0) for k in COUNTED_KINDS},
        # tasks that never ran to the end although nothing expired them: starved (or too big)
        "starved": sum(1 for t in result.tasks if t.outcome == "unfinished"),
        "tasks": len(result.tasks),
        "rejected": result.rejected,
        "succeeded": len(done),
        "throughput_per_s": round(len(done) / result.makespan_s, 4) if result.makespan_s else 0.0,
        "makespan_s": round(result.makespan_s, 3),
        "wall_s": round(result.wall_s, 3),
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _duration(x: float | None) -> str:
    """A wait in a few characters (17.5d, not 1512025.85s, which would fill its column)."""
    if x is None:
        return "-"
    if x < 1000:
        return f"{x:.2f}s"
    if x < 2 * 3600:
        return f"{x / 60:.1f}min"
    if x < 2 * 86400:
        return f"{x / 3600:.1f}h"
    return f"{x / 86400:.1f}d"


def render(reports: list[dict[str, Any]]) -> str:
    """One table for one or more runs (policies side by side)."""
    lines = [f"{'POLICY':<11}{'PRI':<5}{'TASKS':>7}{'SLA':>8}{'WITHIN':>9}{'WAIT P50':>11}"
             f"{'WAIT P99':>11}{'EXPIRED':>9}{'COLD':>7}"]
    for r in reports:
        for name, p in r["priorities"].items():
            within = None if p["sla_attainment"] is None else 100 * p["sla_attainment"]
            sla = "-" if p["sla_s"] is None else f"{p['sla_s']:g}s"
            shown = "-" if within is None else f"{within:.1f}%"
            p50, p99 = (_duration(p[k]) for k in ("wait_p50_s", "wait_p99_s"))
            lines.append(f"{r['policy']:<11}{name:<5}{p['tasks']:>7}{sla:>8}{shown:>9}"
                         f"{p50:>11}{p99:>11}{p['expired']:>9}{p['cold_starts']:>7}")
    lines.append("")
    lines.append(f"{'POLICY':<11}{'GPU BUSY':>9}{'RUNNING':>9}{'LOADS':>7}{'PREEMPT R/Y/S':>15}{'STARVED':>9}"
                 f"{'TASKS/S':>9}{'MAKESPAN':>11}{'WALL':>8}")
    for r in reports:
        pre = r["preemptions"]
        kinds = f"{pre['reserved']}/{pre['yielded']}/{pre['stopped']}"
        lines.append(f"{r['policy']:<11}{100 * r['gpu_busy_fraction']:>8.1f}%"
                     f"{100 * r['gpu_running_fraction']:>8.1f}%{r['model_loads']:>7}"
                     f"{kinds:>15}{r['starved']:>9}{r['throughput_per_s']:>9.3f}"
                     f"{r['makespan_s']:>10.0f}s{r['wall_s']:>7.1f}s")
    return "\n".join(lines)
