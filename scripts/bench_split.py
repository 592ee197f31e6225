#!/usr/bin/env python
"""What splitting one pool into several costs in placement: one 16x80 GB pool against two
8x80 GB pools (and four 4x80 GB pools), each smaller pool serving a fixed set of models.

The trace's requests (the GenAI trace's first ``--limit`` by default) are replayed through
the real scheduling scripts (``gpuq.sim.run.simulate``, the gpuq policy) at one speedup for
every layout: the one that offers the 16-GPU pool ``--target-load`` of its capacity. A split
into N pools deals the models out to N groups (a pool per model family), balanced by
offered work: models by descending Σ service_s (ties by name), each to the group with the
least work so far (ties: the lower group). Each group's requests are replayed on its own
pool of 16/N GPUs; the per-task results of the N replays are then merged on one timeline
and reported as one fleet: P0/P1 SLA attainment (handler started, model loaded, within the
SLA), P2/P3 waits, model loads, GPU busy share (over all 16 GPUs).

    python scripts/bench_split.py                     # genai, first 6,000 requests (~20 s)
    python scripts/bench_split.py --limit 4000 --splits 1,2 --json
    python scripts/bench_split.py --trace requests.csv --gpus 8   # a CSV trace of your own
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuq.config import Config  # noqa: E402
from gpuq.errors import GpuqError  # noqa: E402
from gpuq.sim.cli import read_trace, replaying  # noqa: E402
from gpuq.sim.model import SimResult, TraceTask  # noqa: E402
from gpuq.sim.report import summarize  # noqa: E402
from gpuq.sim.run import parse_gpus, simulate, speedup_for  # noqa: E402


def groups_of(tasks: list[TraceTask], n: int) -> list[list[str]]:
    """The models dealt out to n groups, balanced by offered work (Σ service_s): the largest
    first (ties by name), each to the group with the least work so far (ties: the lower)."""
    work: dict[str, float] = {}
    for t in tasks:
        work[t.model] = work.get(t.model, 0.0) + t.service_s
    groups: list[list[str]] = [[] for _ in range(n)]
    load = [0.0] * n
    for model in sorted(work, key=lambda m: (-work[m], m)):
        i = min(range(n), key=lambda g: (load[g], g))
        groups[i].append(model)
        load[i] += work[model]
    return [sorted(g) for g in groups]


def merged(parts: list[tuple[SimResult, float]], speedup: float) -> SimResult:
    """One fleet's result from the replays of its pools. Each replay counts time from its own
    first arrival: ``offset`` (virtual seconds) puts it back on the whole trace's timeline.
    Task and worker ids get their pool's index, so they stay unique."""
    first = parts[0][0]
    out = SimResult(policy=first.policy, speedup=speedup, gpus=[], sla_s=first.sla_s, tasks=[],
                    kv_reserve_gb=first.kv_reserve_gb)
    for i, (r, offset) in enumerate(parts):
        def shift(x: float | None, offset: float = offset) -> float | None:
            return None if x is None else x + offset

        out.gpus += [(f"p{i}-{w}", gb) for w, gb in r.gpus]
        out.tasks += [replace(t, id=f"p{i}-{t.id}", arrival_s=t.arrival_s + offset,
                              start_s=shift(t.start_s), exec_s=shift(t.exec_s), end_s=shift(t.end_s))
                      for t in r.tasks]
        out.busy_s.update({f"p{i}-{w}": s for w, s in r.busy_s.items()})
        out.loading_s.update({f"p{i}-{w}": s for w, s in r.loading_s.items()})
        out.busy_intervals.update({f"p{i}-{w}": [(a + offset, b + offset) for a, b in spans]
                                   for w, spans in r.busy_intervals.items()})
        out.model_loads += r.model_loads
        for kind, count in r.preemptions.items():
            out.preemptions[kind] = out.preemptions.get(kind, 0) + count
        out.makespan_s = max(out.makespan_s, offset + r.makespan_s)
        out.wall_s += r.wall_s
        out.rejected += r.rejected
    out.tasks.sort(key=lambda t: t.arrival_s)  # request order: the offline reference reads it
    return out


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """What the comparison reads of a simulator report."""
    p = report["priorities"]
    return {"P0_sla_attainment": p["P0"]["sla_attainment"], "P1_sla_attainment": p["P1"]["sla_attainment"],
            "P0_wait_p99_s": p["P0"]["wait_p99_s"], "P1_wait_p99_s": p["P1"]["wait_p99_s"],
            "P2_wait_p50_s": p["P2"]["wait_p50_s"], "P2_wait_p99_s": p["P2"]["wait_p99_s"],
            "P3_wait_p50_s": p["P3"]["wait_p50_s"], "P3_wait_p99_s": p["P3"]["wait_p99_s"],
            "cold_starts_p0": p["P0"]["cold_starts"], "model_loads": report["model_loads"],
            "gpu_busy_fraction": report["gpu_busy_fraction"],
            "gpu_loading_fraction": report["gpu_loading_fraction"],
            "expired": sum(x["expired"] for x in p.values()), "starved": report["starved"],
            "tasks": report["tasks"], "succeeded": report["succeeded"],
            "makespan_s": report["makespan_s"]}


def layout(tasks: list[TraceTask], n: int, gpus: int, gb: float, speedup: float, load: Any,
           seed: int, config: Config, server: Any) -> dict[str, Any]:
    """The fleet as n pools of gpus/n GPUs, one model group each; the merged figures and
    each pool's own."""
    # simulate counts time from the first task a GPU of the pool can hold (it refuses the
    # rest): the same rule places each pool's replay on the whole trace's timeline
    usable = gb - config.kv_reserve_gb

    def first_kept(ts: list[TraceTask]) -> float:
        return min((t.arrival_s for t in ts if t.gpus == 1 and t.vram_gb <= usable), default=0.0)

    first = first_kept(tasks)
    parts, pools = [], []
    for i, models in enumerate(groups_of(tasks, n)):
        chosen = set(models)
        mine = [t for t in tasks if t.model in chosen]
        result = simulate(mine, parse_gpus(f"{gpus // n}x{gb:g}"), "gpuq", speedup=speedup,
                          load_time=load, seed=seed, config=config, server=server)
        offset = (first_kept(mine) - first) / speedup
        parts.append((result, offset))
        pools.append({"models": len(models), "requests": len(mine),
                      "offered_gpu_s": round(sum(t.service_s for t in mine), 1),
                      **figures(summarize(result))})
        print(f"  {n} pool(s): pool {i} ({len(mine)} requests, {len(models)} models) "
              f"{result.wall_s:.0f} s", file=sys.stderr, flush=True)
    whole = summarize(merged(parts, speedup))
    return {"pools": n, "gpus_per_pool": gpus // n, **figures(whole), "per_pool": pools,
            "reference_loads": whole["reference"]["loads"]}


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}s"


def render(out: dict[str, Any]) -> str:
    a = out["args"]
    which = "first" if a["limit"] else "all"
    load = "given" if a["speedup"] else f"offers {a['target_load']:g} of {a['gpus']}x{a['gb']:g} GB"
    lines = [f"{a['trace']}, {which} {out['tasks']} requests, seed {a['seed']}, speedup "
             f"{out['speedup']:.3f} ({load}), gpuq policy",
             "", f"{'LAYOUT':<10}{'P0 SLA':>8}{'P1 SLA':>8}{'P0 P99':>9}{'P2 P50':>9}{'P2 P99':>9}"
             f"{'P3 P50':>9}{'P3 P99':>9}{'LOADS':>7}{'COLD P0':>8}{'BUSY':>7}{'LOADING':>8}"]
    for r in out["layouts"]:
        name = f"{r['pools']}x{r['gpus_per_pool']}"
        lines.append(f"{name:<10}{pct(r['P0_sla_attainment']):>8}{pct(r['P1_sla_attainment']):>8}"
                     f"{secs(r['P0_wait_p99_s']):>9}{secs(r['P2_wait_p50_s']):>9}"
                     f"{secs(r['P2_wait_p99_s']):>9}{secs(r['P3_wait_p50_s']):>9}"
                     f"{secs(r['P3_wait_p99_s']):>9}{r['model_loads']:>7}{r['cold_starts_p0']:>8}"
                     f"{pct(r['gpu_busy_fraction']):>7}{pct(r['gpu_loading_fraction']):>8}")
    lines += ["", "LAYOUT = pools x GPUs each; waits: arrival to handler start; BUSY, LOADING: "
                  "share of all GPUs' time, first arrival to last end"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="genai", help="a trace name or a CSV file (docs/SIMULATOR.md)")
    ap.add_argument("--traces-dir", default=None, help="default: $GPUQ_TRACES")
    ap.add_argument("--limit", type=int, default=6000, help="the first N requests (0: all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--gpus", type=int, default=16, help="GPUs of the whole fleet")
    ap.add_argument("--gb", type=float, default=80.0, help="VRAM of each GPU")
    ap.add_argument("--splits", default="1,2,4", help="pool counts to compare; each divides --gpus")
    ap.add_argument("--target-load", type=float, default=0.8,
                    help="the speedup offers this share of the whole fleet's capacity")
    ap.add_argument("--speedup", type=float, default=None, help="instead of --target-load")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        splits = [int(s) for s in args.splits.split(",")]
    except ValueError:
        ap.error(f"--splits {args.splits!r}: pool counts, e.g. 1,2,4")
    if any(n < 1 or args.gpus % n for n in splits):
        ap.error(f"--splits {args.splits!r}: each must divide --gpus {args.gpus}")
    if args.limit < 0:
        ap.error("--limit must be >= 0")
    started = time.monotonic()
    config = Config.from_env()
    try:
        tasks, loads = read_trace(args.trace, args.traces_dir, args.seed, args.limit or None)
    except GpuqError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    speedup = args.speedup or speedup_for(tasks, args.gpus, args.target_load)
    with replaying() as server:
        layouts = [layout(tasks, n, args.gpus, args.gb, speedup, loads.sample, args.seed, config,
                          server) for n in splits]
    out = {"args": vars(args), "tasks": len(tasks), "models": len({t.model for t in tasks}),
           "speedup": round(speedup, 4), "layouts": layouts,
           "wall_s": round(time.monotonic() - started, 1)}
    print(json.dumps(out, indent=2) if args.json else render(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
