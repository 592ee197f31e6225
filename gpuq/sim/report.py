"""The figures of a simulation run, as one JSON-able object and as a text table."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpuq.metrics import PREEMPTION_KINDS
from gpuq.report import percentile
from gpuq.sim.model import SimResult, devices_of
from gpuq.sim.reference import Request, ratio, references

# the engine counts what the planner decided and what the GPUs did; a yield request
# withdrawn before it was honoured is not counted, so not reported
COUNTED_KINDS = tuple(k for k in PREEMPTION_KINDS if k != "withdrawn")


def summarize(result: SimResult) -> dict[str, Any]:
    """The report object: per priority, then per pool (keys as ``gpuq simulate --json``)."""
    priorities = {f"P{p}": _priority(result, p) for p in range(4)}
    done = [t for t in result.tasks if t.outcome == "succeeded"]
    gpus = len(result.gpus)
    busy, loading = sum(result.busy_s.values()), sum(result.loading_s.values())
    capacity = gpus * result.makespan_s
    sizes = [(gb, devices_of(wid)) for wid, gb in result.gpus]
    scaled = result.autoscale
    if scaled is not None:  # GPUs came and went: their own hours, the largest pool's VRAM
        capacity = scaled["gpu_hours"] * 3600
        sizes = [sizes[0]] * scaled["max"]
    refs = references([Request(t.model, t.vram_gb, t.priority) for t in result.tasks],
                      sizes, result.kv_reserve_gb)
    best = refs["reference"]
    return {
        "policy": result.policy,
        "speedup": result.speedup,
        "gpus": [gb for _, gb in result.gpus],
        "pool": pool_spec([wid for wid, _ in result.gpus], [gb for _, gb in result.gpus]),
        "priorities": priorities,
        # busy = loading + running; the split shows whether busy time was useful work
        "gpu_busy_fraction": round(busy / capacity, 4) if capacity else 0.0,
        "gpu_loading_fraction": round(loading / capacity, 4) if capacity else 0.0,
        "gpu_running_fraction": round((busy - loading) / capacity, 4) if capacity else 0.0,
        "model_loads": result.model_loads,
        **refs,
        "vs_reference": {
            "model_loads": ratio(result.model_loads, best["loads"]),
            "cold_starts_p0": ratio(priorities["P0"]["cold_starts"], best["cold_starts"]["P0"])},
        "preemptions": {k: result.preemptions.get(k, 0) for k in COUNTED_KINDS},
        # tasks that never ran to the end although nothing expired them: starved (or too big)
        "starved": sum(1 for t in result.tasks if t.outcome == "unfinished"),
        "tasks": len(result.tasks),
        "rejected": result.rejected,
        "succeeded": len(done),
        "throughput_per_s": round(len(done) / result.makespan_s, 4) if result.makespan_s else 0.0,
        "makespan_s": round(result.makespan_s, 3),
        "wall_s": round(result.wall_s, 3),
        **({} if scaled is None else {"autoscale": scaled}),
    }


def _priority(result: SimResult, p: int) -> dict[str, Any]:
    """One priority's figures. The SLA is met when the handler starts with its model loaded
    in time: a claim in time followed by a load is a miss."""
    tasks = [t for t in result.tasks if t.priority == p]
    sla = result.sla_s[p]
    waits = [t.exec_s - t.arrival_s for t in tasks if t.exec_s is not None]
    claim_waits = [t.start_s - t.arrival_s for t in tasks if t.start_s is not None]
    cold = [t for t in tasks if t.cold_start]
    load_waits = [t.load_wait_s for t in cold]
    return {
        "tasks": len(tasks),
        "sla_s": sla,
        # every task counts: one that never started (expired, unfinished) missed its SLA
        "sla_attainment": _share(waits, sla, len(tasks)),
        "claim_sla_attainment": _share(claim_waits, sla, len(tasks)),
        "wait_p50_s": _round(percentile(waits, 0.50)),  # arrival to handler start
        "wait_p99_s": _round(percentile(waits, 0.99)),
        "claim_wait_p50_s": _round(percentile(claim_waits, 0.50)),  # arrival to first claim
        "claim_wait_p99_s": _round(percentile(claim_waits, 0.99)),
        "expired": sum(1 for t in tasks if t.outcome == "expired"),
        # the handler's start waited for its own attempt's model load
        "cold_starts": len(cold),
        "load_wait_p50_s": _round(percentile(load_waits, 0.50)),
        "load_wait_p99_s": _round(percentile(load_waits, 0.99)),
    }


def _share(waits: list[float], sla: float | None, tasks: int) -> float | None:
    if not tasks or sla is None:
        return None
    return round(sum(1 for w in waits if w <= sla) / tasks, 4)


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


def pool_spec(ids: list[str], sizes: list[float]) -> str:
    """The pool as ``--gpus`` writes it ("6x80,2x48/01,2x4x80"), from the workers' ids and VRAM."""
    shapes: Counter[tuple[int, float, str]] = Counter()
    for wid, gb in zip(ids, sizes):
        devices = devices_of(wid)
        shapes[devices, gb / devices, wid.partition("@")[2]] += 1
    return ",".join(f"{n}x{f'{d}x' if d > 1 else ''}{per:g}{f'/{lane}' if lane else ''}"
                    for (d, per, lane), n in shapes.items())


def unserved(pool: str) -> list[int]:
    """The priorities no worker of a pool spec serves (every worker a lane serving others)."""
    served: set[int] = set()
    for part in filter(None, pool.split(",")):
        served |= {int(c) for c in part.partition("/")[2] or "0123"}
    return [p for p in range(4) if p not in served]


def heading(report: dict[str, Any], target_load: float | None) -> str:
    """What a replay ran: the trace, its tasks, the pool, and how much its arrivals were sped
    up (target_load: the offered load that chose it; None: the speedup was given)."""
    pool = report.get("pool") or ",".join(f"{n}x{gb:g}" for gb, n in Counter(report["gpus"]).items())
    workers = f"{len(report['gpus'])} workers ({pool.replace(',', ', ')} GB)"
    if a := report.get("autoscale"):  # `gpus` lists every GPU booted, not a pool at once
        workers = (f"{a['min']}-{a['max']} autoscaled workers of {report['gpus'][0]:g} GB "
                   f"(at most {a['peak_gpus']} at once; {a['boots']} boots)")
    chosen = "" if target_load is None else f" (chosen for an offered load of {target_load:g})"
    missing = unserved(pool) if report.get("pool") else []
    starved = ("" if not missing else f"; no worker serves {', '.join(f'P{p}' for p in missing)}: "
               "their tasks never start under gpuq (the baselines ignore lanes)")
    return (f"trace {report['trace']}: {report['tasks']} tasks on {workers}, "
            f"arrivals sped up {report['speedup']:.4g}x{chosen}{starved}")


def render(reports: list[dict[str, Any]]) -> str:
    """Three tables for one or more runs of one trace (policies side by side): per priority,
    per pool, and model loads against the offline references."""
    lines = [f"{'POLICY':<11}{'PRI':<4}{'TASKS':>7}{'SLA':>7}{'WITHIN':>8}{'CLAIMED':>9}{'WAIT P50':>10}"
             f"{'WAIT P99':>10}{'COLD':>6}{'LOAD P50':>10}{'LOAD P99':>10}{'EXPIRED':>8}"]
    for r in reports:
        for name, p in r["priorities"].items():
            sla = "-" if p["sla_s"] is None else f"{p['sla_s']:g}s"
            within, claimed = (_percent(p[k]) for k in ("sla_attainment", "claim_sla_attainment"))
            waits = "".join(f"{_duration(p[k]):>10}" for k in ("wait_p50_s", "wait_p99_s"))
            loads = "".join(f"{_duration(p[k]):>10}" for k in ("load_wait_p50_s", "load_wait_p99_s"))
            lines.append(f"{r['policy']:<11}{name:<4}{p['tasks']:>7}{sla:>7}{within:>8}{claimed:>9}"
                         f"{waits}{p['cold_starts']:>6}{loads}{p['expired']:>8}")
    lines.append("")
    lines.append(f"{'POLICY':<11}{'LOADING':>9}{'RUNNING':>9}{'PREEMPT R/Y/S':>15}{'STARVED':>9}"
                 f"{'TASKS/S':>9}{'MAKESPAN':>11}{'WALL':>8}")
    for r in reports:
        pre = r["preemptions"]
        kinds = f"{pre['reserved']}/{pre['yielded']}/{pre['stopped']}"
        lines.append(f"{r['policy']:<11}{100 * r['gpu_loading_fraction']:>8.1f}%"
                     f"{100 * r['gpu_running_fraction']:>8.1f}%{kinds:>15}{r['starved']:>9}"
                     f"{r['throughput_per_s']:>9.3f}{r['makespan_s']:>10.0f}s{r['wall_s']:>7.1f}s")
    lines.append("")
    lines.append(f"{'POLICY':<11}{'LOADS':>7}{'/REF':>8}{'COLD P0':>9}{'/REF':>8}"
                 + "".join(f"{f'COLD P{p}':>9}" for p in (1, 2, 3)))
    rows = [(r["policy"], r["model_loads"], {k: p["cold_starts"] for k, p in r["priorities"].items()},
             r["vs_reference"]["model_loads"], r["vs_reference"]["cold_starts_p0"]) for r in reports]
    shown: list[Any] = []  # one trace: the reports' references are the same
    for r in reports:
        best = r["reference"]
        for ref in (best, r["reference_lru"]):
            if ref not in shown:
                shown.append(ref)
                rows.append((f"ref {ref['rule']}", ref["loads"], ref["cold_starts"],
                             ratio(ref["loads"], best["loads"]),
                             ratio(ref["cold_starts"]["P0"], best["cold_starts"]["P0"])))
    for name, loads, cold, loads_x, cold_x in rows:
        lines.append(f"{name:<11}{loads:>7}{_times(loads_x):>8}{cold['P0']:>9}{_times(cold_x):>8}"
                     + "".join(f"{cold[f'P{p}']:>9}" for p in (1, 2, 3)))
    scaled = [r for r in reports if "autoscale" in r]
    if scaled:
        lines += ["", f"{'SIGNAL':<11}{'GPU-HOURS':>10}{'MEAN GPUS':>10}{'PEAK':>6}{'BOOTS':>7}"
                      f"{'RETIRED':>8}{'P0 WITHIN':>10}{'P1 WITHIN':>10}"]
        for r in scaled:
            a, p = r["autoscale"], r["priorities"]
            lines.append(f"{r['policy']:<11}{a['gpu_hours']:>10.1f}{a['mean_gpus']:>10.2f}{a['peak_gpus']:>6}"
                         f"{a['boots']:>7}{a['retired']:>8}{_percent(p['P0']['sla_attainment']):>10}"
                         f"{_percent(p['P1']['sla_attainment']):>10}")
    refused = max((r["rejected"] for r in reports), default=0)
    if refused:  # left out of every table above: say so, or a trace seems to lose tasks
        lines += ["", f"{refused} task(s) refused up front, as enqueue's checks would: no GPU or group",
                  "holds them (VRAM less the KV reserve, or GPUs), a deadline under their est_s, or",
                  "past their tenant's caps"]
    return "\n".join(lines)


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def _times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def render_split(reports: list[dict[str, Any]], key: str = "tenants", title: str = "TENANT") -> str:
    """Each part's tasks per policy: the named tenants (``tenants``), or 70B models' and the
    others' (``by_size``)."""
    lines = [f"{'POLICY':<11}{title:<16}{'TASKS':>7}{'WAIT P50':>10}{'WAIT P99':>10}{'WITHIN':>8}"]
    for r in reports:
        for name, f in r.get(key, {}).items():
            within = "-" if f["sla_attainment"] is None else f"{100 * f['sla_attainment']:.1f}%"
            lines.append(f"{r['policy']:<11}{name[:15]:<16}{f['tasks']:>7}{_duration(f['wait_p50_s']):>10}"
                         f"{_duration(f['wait_p99_s']):>10}{within:>8}")
    return "\n".join(lines)

