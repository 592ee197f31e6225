"""Tenant isolation: a tenant flooding P1 at ten times another's rate, replayed.

Tenant B sends P1 tasks at a steady Poisson rate; tenant A sends P1 tasks of the same model at
ten times that rate, more than the pool can run, so A's backlog grows for the whole replay.
The same seeded arrivals are replayed through the real scheduling scripts and the reaper's
rounds (``gpuq.sim``) in five runs: B alone; A and B with no tenant registered (a tenant is
a label: one FIFO by start-by time); A and B registered with equal weights and no room kept
(``tenant_headroom`` 0: the level shared by weight alone); the same with the default room for
recent demand (gpuq.reaper.tenant_room); and, with no room, A capped at ``--cap`` GPUs. For
each run it prints B's P1 waits (arrival to handler start) and SLA attainment, and A's
throughput.

    python scripts/bench_tenants.py            # 8x80 GB, 30 virtual minutes (~1-2 min)
    python scripts/bench_tenants.py --json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuq.config import Config  # noqa: E402
from gpuq.embedded import EmbeddedServer  # noqa: E402
from gpuq.sim.cli import tenant_figures  # noqa: E402
from gpuq.sim.model import TraceTask  # noqa: E402
from gpuq.sim.run import parse_gpus, simulate  # noqa: E402
from gpuq.tenants import Tenant  # noqa: E402


def arrivals(tenant: str, rate: float, span_s: float, service_s: float,
             rng: random.Random) -> list[TraceTask]:
    """Poisson arrivals of P1 tasks of one model; run times exponential with mean service_s
    (also each task's estimate), so GPUs do not free up in lockstep."""
    out, t = [], rng.expovariate(rate)
    while t < span_s:
        out.append(TraceTask(arrival_s=t, model="m", vram_gb=20.0, priority=1,
                             service_s=rng.expovariate(1 / service_s), est_s=service_s,
                             preemptible=False, tenant=tenant))
        t += rng.expovariate(rate)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default="8x80")
    ap.add_argument("--span-s", type=float, default=1800.0, help="virtual seconds of arrivals")
    ap.add_argument("--service-s", type=float, default=4.0)
    ap.add_argument("--rate-b", type=float, default=0.3, help="tenant B's tasks per second")
    ap.add_argument("--flood", type=float, default=10.0, help="A's rate over B's")
    ap.add_argument("--cap", type=int, default=6, help="A's max_gpus in the capped run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    b = arrivals("b", args.rate_b, args.span_s, args.service_s, rng)
    a = arrivals("a", args.rate_b * args.flood, args.span_s, args.service_s, rng)
    gpus = parse_gpus(args.gpus)
    equal = (Tenant("a"), Tenant("b"))
    runs = [("B alone", b, (), Config()), ("A+B, no tenants", a + b, (), Config()),
            ("A+B, weights, no room", a + b, equal, Config(tenant_headroom=0)),
            ("A+B, equal weights", a + b, equal, Config()),
            (f"A+B, A max_gpus {args.cap}", a + b, (Tenant("a", max_gpus=args.cap), Tenant("b")),
             Config(tenant_headroom=0))]
    out = []
    server = EmbeddedServer("redis").start()
    started = time.monotonic()
    try:
        for name, tasks, tenants, config in runs:
            ordered = sorted(tasks, key=lambda t: t.arrival_s)
            result = simulate(ordered, gpus, "gpuq", speedup=1.0, load_time=lambda _m, _rng: 20.0,
                              seed=args.seed, config=config, server=server, tenants=tenants)
            # A's tasks run while arrivals last: its share of the pool under the flood
            a_done = sum(1 for t in result.tasks if t.tenant == "a" and t.end_s is not None
                         and t.end_s <= args.span_s)
            out.append({"run": name, "b": tenant_figures(result, "b"),
                        "a": tenant_figures(result, "a") if tasks is not b else None,
                        "a_done_per_s": round(a_done / args.span_s, 3)})
            print(f"  {name}: {result.wall_s:.0f} s", file=sys.stderr)
    finally:
        server.stop()
    if args.json:
        print(json.dumps({"args": vars(args), "runs": out, "wall_s": round(time.monotonic() - started, 1)}))
        return 0
    print(f"{args.gpus} GB, {args.span_s:g} s of arrivals; B: {len(b)} P1 tasks ({args.rate_b:g}/s), "
          f"A: {len(a)} ({args.rate_b * args.flood:g}/s), {args.service_s:g} s each on average, one model; "
          f"A DONE/S: A's tasks ended while arrivals lasted\n")
    print(f"{'RUN':<24}{'B P50':>10}{'B P99':>10}{'B MEAN':>10}{'B IN SLA':>10}{'A DONE/S':>10}")
    for r in out:
        f = r["b"]
        print(f"{r['run']:<24}{f['wait_p50_s']:>9.2f}s{f['wait_p99_s']:>9.2f}s{f['wait_mean_s']:>9.2f}s"
              f"{100 * f['sla_attainment']:>9.1f}%{r['a_done_per_s']:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
