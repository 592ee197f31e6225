#!/usr/bin/env python
"""Async handlers on a continuous-batching engine: --concurrency 1 against --concurrency N.

One Redis server started here (gpuq.embedded, a free port); one real worker process at a
time, of the example app workers/engine.py (a simulated engine: each step costs 20 ms plus
1 ms per request in it, and requests arriving while a step runs join the next), each in a
pool of its own. The worker loads the engine on a warm-up task first; then the same number
of ``engine.generate`` tasks (``--tokens`` steps each) is enqueued at once, and the tasks/s
come from the tasks' own records (first start to last end), for ``--concurrency 1`` (one at
a time) and ``--concurrency N`` (N coroutines on the worker's event loop sharing the one
engine), with the ratio. Beside each figure: what the engine's cost model allows
(1 / (tokens x (step + per request)) one at a time, N / (tokens x (step + N x per request))
with N in every step), so the worker's own overhead shows.

    python scripts/bench_async.py              # 128 tasks of 16 tokens, N=16
    python scripts/bench_async.py --quick      # 32 tasks of 8 tokens, N=16

Figures only, no asserts. Progress goes to stderr; docs/BENCHMARKS.md keeps the figures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from bench.common import log
from bench.procs import spawn, stop, wait_until

from gpuq.client import Queue
from gpuq.embedded import EmbeddedServer
from workers import engine

NEED_GB = 18.0  # 16 GB of weights (shared) + 2 GB of working memory per task
ENV = {"GPUQ_SIM_TIME_SCALE": "1.0", "GPUQ_LOG_LEVEL": "WARNING"}


def worker_args(url: str, pool: str, concurrency: int) -> list[str]:
    return [sys.executable, "-m", "gpuq", "--redis", url, "--pool", pool, "worker", "--app",
            "workers.engine:app", "--vram-gb", "80", "--gpu-name", "bench", "--name", pool,
            "--concurrency", str(concurrency)]


def run(server: EmbeddedServer, concurrency: int, n: int, tokens: int, log_dir: Path) -> float:
    """Tasks/s of one worker process with ``concurrency`` slots running n tasks of
    ``tokens`` engine steps on its warm engine (first start to last end)."""
    pool = f"async-c{concurrency}"
    q = Queue.from_url(server.url, pool=pool)
    p = spawn(worker_args(server.url, pool, concurrency), log_dir, pool, ENV)
    try:
        wait_until(lambda: q.redis.zscore(q.keys.idle, pool) is not None, 60, "worker", p)
        warm = q.enqueue("engine.generate", {"tokens": 1}, model=engine.MODEL, vram_gb=NEED_GB)
        warm_steps = warm.result(timeout=60)["engine_steps"]  # loaded: the run measures steps
        tasks = q.enqueue_many([{"handler": "engine.generate", "payload": {"tokens": tokens},
                                 "model": engine.MODEL, "vram_gb": NEED_GB} for _ in range(n)])
        ids = [t.id for t in tasks]
        results = [t.result(timeout=600) for t in tasks]
        pipe = q.redis.pipeline(transaction=False)
        for tid in ids:
            pipe.hmget(q.keys.task(tid), "state", "started_at", "finished_at")
        rows = pipe.execute()
    finally:
        stop(p, f"concurrency {concurrency} worker")
        q.close()
    if {r[0] for r in rows} != {"succeeded"} or any(r["tokens"] != tokens for r in results):
        raise RuntimeError(f"concurrency {concurrency}: not every task ran its {tokens} tokens")
    if len({r["engine"] for r in results}) != 1:
        raise RuntimeError(f"concurrency {concurrency}: the tasks did not share one engine")
    span_s = (max(int(r[2]) for r in rows) - min(int(r[1]) for r in rows)) / 1000
    steps = max(r["engine_steps"] for r in results) - warm_steps
    log(f"concurrency {concurrency}: {n} tasks in {span_s:.2f} s, {steps} engine steps "
        f"({n * tokens / steps:.1f} requests a step on average, "
        f"{span_s / steps * 1000:.1f} ms a step)")
    return n / max(span_s, 1e-3)


def ideal(concurrency: int, tokens: int) -> float:
    """Tasks/s the engine's cost model allows with ``concurrency`` requests in every step."""
    step_s = engine.STEP_S + engine.PER_REQUEST_S * concurrency
    return concurrency / (tokens * step_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="32 tasks of 8 tokens: a smoke check")
    ap.add_argument("--concurrency", type=int, default=16, help="N of the async run (default 16)")
    ap.add_argument("--tasks", type=int, help="tasks per run (default 128; --quick 32)")
    ap.add_argument("--tokens", type=int, help="engine steps per task (default 16; --quick 8)")
    args = ap.parse_args(argv)
    n = args.tasks or (32 if args.quick else 128)
    tokens = args.tokens or (8 if args.quick else 16)
    c = args.concurrency
    server = EmbeddedServer("redis")
    server.start()
    rate: dict[int, float] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="gpuq-bench-async-") as tmp:
            for concurrency in (1, c):
                log(f"{n} tasks of {tokens} tokens, --concurrency {concurrency}")
                rate[concurrency] = run(server, concurrency, n, tokens, Path(tmp))
    finally:
        server.stop()
    print(f"{n} engine.generate tasks of {tokens} steps, one worker process, warm engine "
          f"(step {engine.STEP_S * 1000:g} ms + {engine.PER_REQUEST_S * 1000:g} ms per request):")
    print(f"  {'':<32} {'tasks/s':>9} {'engine model':>13}")
    for concurrency, label in ((1, "--concurrency 1 (one at a time)"), (c, f"--concurrency {c} async")):
        print(f"  {label:<32} {rate[concurrency]:9.1f} {ideal(concurrency, tokens):13.1f}")
    print(f"  {'ratio':<32} {rate[c] / rate[1]:8.1f}x {ideal(c, tokens) / ideal(1, tokens):12.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
