#!/usr/bin/env python
"""What a scheduling decision costs Redis as the fleet grows: workers W, models M, queued N.

Many simulated workers (no GPUs, no sleeping) register as real workers do, hold models, and
claim and ack through the real scripts; one Redis server started here (a free port, nothing
persisted). Per point: server µs per enqueue, claim and ack (INFO commandstats), client p50/p99
claim latency, task lifecycles per second from a few processes and per second of Redis CPU,
server time of a reaper round, Redis memory per queued task and per worker, and the time and
series count of an exporter scrape.

    python scripts/bench_scale.py --quick        # W 8/64 x M 10/1000, N 10k (< 2 minutes)
    python scripts/bench_scale.py                # the full sweep (see FULL below)
    python scripts/bench_scale.py --json         # one JSON object on stdout
    python scripts/bench_scale.py --workers 2048 --models 1000 --tasks 1000000   # chosen points

The measurements live in scripts/bench/scale*.py; docs/BENCHMARKS.md explains the figures
and reads the last full run. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from itertools import product
from typing import Any

from bench.common import log
from bench.report import environment
from bench.scale import Sizes, measure, warm_up

from gpuq.connection import connect
from gpuq.embedded import EmbeddedServer

QUICK = Sizes(calls=300, load_s=3.0, procs=2, reaper_rounds=2, scrapes=2)
FULL = Sizes(calls=2000, load_s=8.0, procs=2, reaper_rounds=3, scrapes=3)
QUICK_POINTS = list(product((8, 64), (10, 1000), (10_000,)))
# the grid at 100k queued, then 1M queued at M = 1,000 for the smallest and largest fleet
FULL_POINTS = list(product((8, 64, 512, 2048), (10, 1000, 10_000), (100_000,))) + [
    (8, 1000, 1_000_000), (2048, 1000, 1_000_000)]

COLUMNS = (  # header, path in a point's report, digits
    ("W", ("workers",), 0), ("M", ("models",), 0), ("N", ("tasks",), 0),
    ("enq µs", ("verbs", "enqueue", "server_us"), 1), ("claim µs", ("verbs", "claim", "server_us"), 1),
    ("ack µs", ("verbs", "ack", "server_us"), 1),
    ("claim p50 µs", ("verbs", "claim", "p50_us"), 0), ("claim p99 µs", ("verbs", "claim", "p99_us"), 0),
    ("cold claim µs", ("verbs", "cold_claim", "server_us"), 0),
    ("life/s", ("lifecycle", "per_s"), 0), ("life/CPU-s", ("lifecycle", "per_server_cpu_s"), 0),
    ("reaper CPU ms", ("reaper", "server_cpu_ms"), 1), ("reaper wall ms", ("reaper", "wall_ms"), 0),
    ("B/task", ("fill", "bytes_per_task"), 0), ("B/worker", ("fleet", "bytes_per_worker"), 0),
    ("scrape s", ("exporter", "scrape_s"), 3), ("series", ("exporter", "series"), 0),
)


def cell(point: dict[str, Any], path: tuple[str, ...], digits: int) -> str:
    value: Any = point
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if value is None:
        return "–"
    if value < 0:  # a difference of two readings (memory) smaller than their noise
        return "n/a"
    return f"{value:,.{digits}f}"


def table(res: dict[str, Any]) -> str:
    """The points as a markdown table, then how they were measured."""
    lines = ["| " + " | ".join(h for h, _, _ in COLUMNS) + " |",
             "|" + "|".join("---:" for _ in COLUMNS) + "|"]
    for point in res["points"]:
        lines.append("| " + " | ".join(cell(point, path, d) for _, path, d in COLUMNS) + " |")
    env = res["environment"]
    lines += ["", f"{env['server']}, Python {env['python']}, {env['cpus']} CPUs ({env['cpu']}), "
              f"gpuq {env['gpuq_git']}; sizes {res['sizes']}; {res['wall_s']} s"]
    if any(cell(p, path, d) == "n/a" for p in res["points"] for _, path, d in COLUMNS):
        lines.append("n/a: a difference of two readings below their noise (the JSON keeps it)")
    return "\n".join(lines)


def parse_ints(text: str) -> list[int]:
    values = [int(v.replace("_", "")) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="W 8/64 x M 10/1000 at N 10,000, short phases")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--workers", type=parse_ints, help="W values (with --models and --tasks: their grid)")
    ap.add_argument("--models", type=parse_ints, help="M values")
    ap.add_argument("--tasks", type=parse_ints, help="N values (queued tasks)")
    ap.add_argument("--calls", type=int, help="sequential calls per verb at each point")
    ap.add_argument("--load-s", type=float, help="seconds of the lifecycle run (default: the preset's)")
    ap.add_argument("--procs", type=int, help="processes of the lifecycle run (default 2)")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    for name in ("calls", "load_s", "procs"):
        value = getattr(args, name)
        if value is not None:
            if value <= 0:
                ap.error(f"--{name.replace('_', '-')} must be > 0")
            sizes = replace(sizes, **{name: value})
    points = QUICK_POINTS if args.quick else FULL_POINTS
    if args.workers or args.models or args.tasks:
        if not (args.workers and args.models and args.tasks):
            ap.error("--workers, --models and --tasks go together")
        points = list(product(args.workers, args.models, args.tasks))
    t0 = time.perf_counter()
    with EmbeddedServer("redis") as server:
        r = connect(server.url)
        res: dict[str, Any] = {"environment": environment(server, r.info("server")),
                               "sizes": sizes.__dict__, "points": []}
        warm_up(server.url, r)
        for i, (w, m, n) in enumerate(points, 1):
            log(f"point {i}/{len(points)}: W={w} M={m} N={n}")
            res["points"].append(measure(server.url, r, w, m, n, sizes))
        r.close()
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(res, indent=2) if args.json else table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
