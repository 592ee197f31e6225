#!/usr/bin/env python
"""Throughput and latency of gpuq, side by side with a hand-written minimal queue, rq and BullMQ.

One run, one Redis server started here (gpuq.embedded, a free port), redis-py with hiredis:

* enqueue/s one by one (``Queue.enqueue``) and in bulk (``Queue.enqueue_many``, pipelined);
* claim+ack/s of one real worker process draining no-op tasks (``python -m gpuq ... --burst``);
* enqueue -> result latency p50/p99 against one idle worker process;
* Redis commands per task: client-issued (top-level) and including those run inside Lua;
* claim round-trip latency with 1k and 1M tasks queued over 100 models;
* the same figures for a minimal queue (HSET+ZADD enqueue, Lua ZPOPMIN claim, Lua HSET ack,
  BLPOP result wait) and rq's SimpleWorker drain rate, on the same server;
* BullMQ's (Node) enqueue one by one and in bulk, one worker's drain (concurrency 1) and its
  commands per job: bullmq is npm-installed once into .cache/bullmq/; without node or npm one
  line says it is skipped.

    python scripts/bench_throughput.py            # full size (several minutes)
    python scripts/bench_throughput.py --quick    # small sizes, a smoke check
    python scripts/bench_throughput.py --json     # one JSON object on stdout

The measurements live in scripts/bench/; docs/BENCHMARKS.md explains each figure and how it
is measured. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from bench.common import FULL, QUICK
from bench.report import table
from bench.runner import run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke check in under a minute")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--million", type=int, default=None,
                    help="size of the big queue for the claim-latency figure (default 1000000; 0 skips)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="rounds of the enqueue, claim+ack and latency figures, interleaved "
                         "(rates: median; latency: samples pooled); default 3, 1 with --quick")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.million is not None:
        if args.million < 0:
            ap.error("--million must be >= 0")
        sizes = replace(sizes, million=args.million)
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 3)
    if repeat < 1:
        ap.error("--repeat must be >= 1")
    res = run(sizes, repeat)
    print(json.dumps(res, indent=2) if args.json else table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
