#!/usr/bin/env python
"""Streamed results: time from a handler's first emit to the producer receiving it.

One Redis server started here (gpuq.embedded, a free port), two measurements on it:

* gpuq: one worker process (``workers.sim:app``, real time) runs ``sim.stream`` tasks, one at
  a time, each emitting one chunk after ~20 ms; the producer (this process) enqueues the task
  and reads ``task.stream()`` (follow.lua, then XREAD BLOCK). A sample is the producer's clock
  on receipt minus the worker's clock just before ``ctx.emit`` (the chunk's "t"; one host,
  one clock): JSON encoding, emit.lua (fenced XADD), the blocked XREAD's wake and decoding.
* plain Redis: a writer process XADDs an entry holding its clock every ~20 ms, and this
  process reads with XREAD BLOCK: the same round trip with neither gpuq nor its script.

    python scripts/bench_stream.py            # 500 samples each
    python scripts/bench_stream.py --quick    # 60

Figures only, no asserts; progress goes to stderr; docs/BENCHMARKS.md keeps the figures.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import log
from bench.procs import gpuq_worker_args, spawn, stop, wait_until
from bench.stats import pct

from gpuq.client import Queue
from gpuq.embedded import EmbeddedServer

GAP_S = 0.02  # before each emit or XADD: the reader is blocked when it comes
WRITER = """
import sys, time, redis
r = redis.Redis.from_url(sys.argv[1])
for i in range(int(sys.argv[3])):
    time.sleep(float(sys.argv[4]))
    r.xadd(sys.argv[2], {"t": repr(time.time()), "i": i})
r.xadd(sys.argv[2], {"end": "1"})
"""


def gpuq_side(server: EmbeddedServer, samples: int, log_dir: Path) -> list[float]:
    """Seconds from the worker's emit call to this producer's receipt, one task at a time."""
    pool = "stream"
    q = Queue.from_url(server.url, pool=pool)
    p = spawn(gpuq_worker_args(server.url, pool, burst=False, name="w-stream"), log_dir, pool,
              env={"GPUQ_SIM_TIME_SCALE": "1"})
    out: list[float] = []
    try:
        wait_until(lambda: q.redis.zscore(q.keys.idle, "w-stream") is not None, 60, "worker", p)
        for i in range(samples + 1):  # the first loads the model: left out
            task = q.enqueue("sim.stream", {"chunks": 1}, model="bench-model", vram_gb=1,
                             est_s=GAP_S)
            for chunk in task.stream(timeout=30):
                if i:
                    out.append(time.time() - chunk.data["t"])
            if task.result(timeout=30) != 1:
                raise RuntimeError(f"task {task.id}: wrong result")
    finally:
        stop(p, "stream worker")
        q.close()
    return out


def redis_side(server: EmbeddedServer, samples: int) -> list[float]:
    """Seconds from a writer process's XADD call to this reader's receipt (XREAD BLOCK)."""
    r = Queue.from_url(server.url, pool="plain").redis
    key = "plain:stream"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, server.url, key, str(samples),
                               str(GAP_S)])
    out: list[float] = []
    last, done = "0-0", False
    try:
        while not done:
            for _, entries in r.xread({key: last}, count=100, block=1000) or []:
                for entry_id, fields in entries:
                    now = time.time()
                    last = entry_id
                    if "end" in fields:
                        done = True
                    else:
                        out.append(now - float(fields["t"]))
            if writer.poll() not in (None, 0):
                raise RuntimeError(f"writer exited with {writer.returncode}")
    finally:
        writer.wait(30)
        r.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 samples: a smoke check")
    args = ap.parse_args(argv)
    samples = 60 if args.quick else 500
    server = EmbeddedServer("redis")
    server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="gpuq-bench-stream-") as tmp:
            log(f"plain XADD -> XREAD BLOCK: {samples} samples")
            plain = redis_side(server, samples)
            log(f"gpuq ctx.emit -> task.stream(): {samples} samples")
            ours = gpuq_side(server, samples, Path(tmp))
    finally:
        server.stop()
    print(f"first chunk, emit -> received, {samples} samples each (ms):")
    for name, xs in (("plain Redis XADD -> XREAD", plain), ("gpuq ctx.emit -> task.stream", ours)):
        print(f"  {name:<30} p50 {pct(xs, 50) * 1000:7.3f}   p99 {pct(xs, 99) * 1000:7.3f}")
    print(f"  {'ratio gpuq / plain':<30} p50 {pct(ours, 50) / pct(plain, 50):7.2f}x  "
          f"p99 {pct(ours, 99) / pct(plain, 99):7.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
