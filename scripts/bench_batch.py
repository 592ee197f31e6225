#!/usr/bin/env python
"""Batch handlers against single-task handlers: drain rate and P0 latency, in one run.

One Redis server started here (gpuq.embedded, a free port); worker processes of this file's
own app (``--app bench_batch:app``: a no-op handler, as a batch handler of 32 and as a
single-task one), one at a time, each in a pool of its own:

* drain: one burst worker process drains N pre-enqueued no-op tasks; tasks/s from the
  tasks' own records (first start to last end), batch=32 and single, and the ratio, in
  ``--rounds`` interleaved rounds (the median ratio is the figure: the host is shared); and
  what a task cost in CPU, the Redis server's (``INFO cpu``) and the worker process's
  (its rusage, less that of a worker that starts and finds nothing), which other load on
  the host disturbs less than a rate;
* P0 latency: a trickle of P0 no-op tasks (enqueue -> result, p50/p99) sent one at a time
  to one worker process, idle, then kept busy with a backlog of P3 no-op tasks of the same
  handler and model (a P0 task then waits for the task, or the batch, that runs).

    python scripts/bench_batch.py            # N=20000, 300 P0 samples
    python scripts/bench_batch.py --quick    # N=2000, 60 P0 samples

Figures only, no asserts (the issue's target: >= 5x drain, P0 latency not worse). Progress
goes to stderr; docs/BENCHMARKS.md keeps the figures.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from bench.common import log
from bench.procs import finish, spawn, stop, wait_until
from bench.stats import pct

from gpuq.app import App, BatchContext, Context
from gpuq.client import Queue
from gpuq.embedded import EmbeddedServer

MODEL, VRAM_GB, BATCH = "bench-model", 1.0, 32


class Drain(NamedTuple):
    per_s: float
    server_us: float  # Redis CPU per task
    worker_us: float  # the worker process's CPU per task
HANDLERS = {"batch": "bench.batch_noop", "single": "bench.noop"}
app = App("bench-batch")


@app.any_model()
def load(name: str) -> str:
    return name


@app.handler(HANDLERS["batch"], batch=BATCH)
def batch_noop(model: Any, payloads: list[Any], ctx: BatchContext) -> list[Any]:
    return payloads


@app.handler(HANDLERS["single"])
def noop(model: Any, payload: Any, ctx: Context) -> Any:
    return payload


def worker_args(url: str, pool: str, name: str, *, burst: bool) -> list[str]:
    args = [sys.executable, "-m", "gpuq", "--redis", url, "--pool", pool, "worker", "--app",
            "bench_batch:app", "--vram-gb", "80", "--gpu-name", "bench", "--name", name]
    return args + (["--burst"] if burst else [])


def tasks(kind: str, start: int, end: int, priority: str) -> list[dict[str, Any]]:
    return [{"handler": HANDLERS[kind], "payload": {"i": i}, "model": MODEL, "vram_gb": VRAM_GB,
             "priority": priority} for i in range(start, end)]


def cpu_s(q: Queue) -> float:
    """The Redis server's CPU seconds so far."""
    info = q.redis.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def idle_cpu_s(server: EmbeddedServer, log_dir: Path) -> float:
    """The CPU seconds of a burst worker process that finds nothing to do: its start-up and
    exit, which drain takes off the worker's CPU."""
    before = children_cpu_s()
    finish(spawn(worker_args(server.url, "drain-empty", "drain-empty", burst=True), log_dir,
                 "drain-empty"), 900, "empty burst worker")
    return children_cpu_s() - before


def drain(server: EmbeddedServer, kind: str, n: int, log_dir: Path, rnd: int, idle_s: float) -> Drain:
    """One burst worker draining n queued no-op tasks: tasks/s (first start to last end) and
    CPU µs per task, the server's and the worker process's (less its start-up, idle_s)."""
    pool = f"drain-{kind}-{rnd}"
    q = Queue.from_url(server.url, pool=pool)
    ids = [t.id for i in range(0, n, 2000) for t in q.enqueue_many(tasks(kind, i, min(n, i + 2000), "P2"))]
    server_cpu, worker_cpu = cpu_s(q), children_cpu_s()
    finish(spawn(worker_args(server.url, pool, pool, burst=True), log_dir, pool), 900,
           f"{kind} burst worker")
    server_cpu, worker_cpu = cpu_s(q) - server_cpu, children_cpu_s() - worker_cpu - idle_s
    pipe = q.redis.pipeline(transaction=False)
    for tid in ids:
        pipe.hmget(q.keys.task(tid), "state", "started_at", "finished_at")
    rows = pipe.execute()
    states = {r[0] for r in rows}
    if states != {"succeeded"}:
        raise RuntimeError(f"{kind} drain: task states {states}")
    span_s = (max(int(r[2]) for r in rows) - min(int(r[1]) for r in rows)) / 1000
    q.close()
    return Drain(n / max(span_s, 1e-3), server_cpu / n * 1e6, worker_cpu / n * 1e6)


def p0_latency(server: EmbeddedServer, kind: str, samples: int, log_dir: Path,
               busy: bool) -> list[float]:
    """Enqueue -> result seconds of P0 tasks sent one at a time to a worker, idle or (busy)
    kept busy with a P3 backlog of the same handler and model, topped up before each sample."""
    pool = f"lat-{kind}-{'busy' if busy else 'idle'}"
    q = Queue.from_url(server.url, pool=pool)
    backlog = q.keys.queue(3, MODEL)
    p = spawn(worker_args(server.url, pool, pool, burst=False), log_dir, pool)
    out: list[float] = []
    try:
        wait_until(lambda: q.redis.zscore(q.keys.idle, pool) is not None, 60, "worker", p)
        filled = 0
        for i in range(samples):
            if busy and q.redis.zcard(backlog) < 300:
                q.enqueue_many(tasks(kind, filled, filled + 1000, "P3"))
                filled += 1000
            time.sleep(0.005)
            t0 = time.perf_counter()
            got = q.enqueue(HANDLERS[kind], {"p0": i}, model=MODEL, vram_gb=VRAM_GB,
                            priority="P0").result(timeout=30)
            out.append(time.perf_counter() - t0)
            if got != {"p0": i}:
                raise RuntimeError(f"{kind} latency: wrong result {got!r}")
    finally:
        stop(p, f"{kind} latency worker")
        q.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke check")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved drain rounds (default 3)")
    args = ap.parse_args(argv)
    n, samples = (2000, 60) if args.quick else (20000, 300)
    server = EmbeddedServer("redis")
    server.start()
    rounds: list[dict[str, Drain]] = []
    lat: dict[tuple[str, bool], list[float]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="gpuq-bench-batch-") as tmp:
            idle_s = idle_cpu_s(server, Path(tmp))
            for rnd in range(max(1, args.rounds)):
                got = {}
                for kind in ("single", "batch"):
                    log(f"drain: {n} no-op tasks, {kind} handler (round {rnd + 1}/{args.rounds})")
                    got[kind] = drain(server, kind, n, Path(tmp), rnd, idle_s)
                rounds.append(got)
            for kind in ("single", "batch"):
                for busy in (False, True):
                    log(f"P0 latency: {samples} samples, {kind} handler, busy={busy}")
                    lat[kind, busy] = p0_latency(server, kind, samples, Path(tmp), busy)
    finally:
        server.stop()
    print(f"drain, {n} no-op tasks, one worker process, {len(rounds)} rounds (tasks/s; CPU us per"
          " task, Redis + worker):")
    def us(x: float) -> str:  # the worker's: its CPU less a start-up's, which --quick may not exceed
        return f"{x:5.1f}" if x >= 0 else "  n/a"

    for kind, label in (("single", "single-task handler     "), ("batch", f"batch handler (batch={BATCH})")):
        print(f"  {label}  " + "  ".join(f"{r[kind].per_s:7.0f} ({r[kind].server_us:5.1f} + "
                                         f"{us(r[kind].worker_us)})" for r in rounds))
    ratios = [r["batch"].per_s / r["single"].per_s for r in rounds]
    cost = [(r["single"].server_us + r["single"].worker_us) / (r["batch"].server_us + r["batch"].worker_us)
            for r in rounds if min(r["single"].worker_us, r["batch"].worker_us) >= 0]
    print("  ratio                      " + "  ".join(f"{x:7.1f}x" + " " * 16 for x in ratios))
    print(f"  median ratio {statistics.median(ratios):.1f}x (target >= 5x); CPU per task, single over"
          " batch: " + (f"median {statistics.median(cost):.1f}x" if cost else "n/a"))
    if len(cost) < len(rounds):
        print("  n/a: the worker's CPU less a start-up's (measured apart) came out below zero: "
              "too few tasks to tell (--quick)")
    print(f"P0 enqueue -> result, one worker process, {samples} samples (ms):")
    for busy in (False, True):
        for kind in ("single", "batch"):
            xs = lat[kind, busy]
            print(f"  {'P3 backlog' if busy else 'idle':<10}  {kind:<6} handler  "
                  f"p50 {pct(xs, 50) * 1000:7.2f}   p99 {pct(xs, 99) * 1000:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
