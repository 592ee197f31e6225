"""What every part of the benchmark shares: sizes, constants, logging, the run's context."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from gpuq.client import Queue
from gpuq.connection import connect
from gpuq.embedded import EmbeddedServer

MODEL = "bench-model"
VRAM_GB = 1.0
IDLE_GAP_S = 0.005  # pause before each latency sample (untimed): the worker is idle, blocked


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def round_trips(side: str, send: Callable[[int], Any], n: int, warm: int) -> list[float]:
    """Seconds from just before ``send(i)`` (enqueue no-op task i and wait for its result) to
    its return, after warm-up; each sample starts with the worker idle, blocked."""
    out = []
    for i in range(warm + n):
        time.sleep(IDLE_GAP_S)
        t0 = time.perf_counter()
        result = send(i)
        dt = time.perf_counter() - t0
        if result != {"i": i}:
            raise RuntimeError(f"{side} latency: wrong result {result!r}")
        if i >= warm:
            out.append(dt)
    return out


def noop_tasks(start: int, end: int, model: str = MODEL) -> list[dict[str, Any]]:
    """gpuq bulk-enqueue items: no-op tasks numbered start..end-1."""
    return [{"handler": "sim.noop", "payload": {"i": i}, "model": model, "vram_gb": VRAM_GB}
            for i in range(start, end)]


@dataclass(frozen=True)
class Sizes:
    enqueue: int  # tasks enqueued one by one
    bulk: int  # tasks enqueued in bulk
    batch: int  # tasks per bulk call (enqueue_many / one minimal pipeline)
    drain: int  # tasks drained by one worker (gpuq and minimal)
    rq: int  # jobs drained by one rq SimpleWorker
    latency: int  # enqueue -> result samples
    latency_warmup: int
    warmup: int  # untimed operations before each timed enqueue phase
    accounting: int  # tasks in the MONITOR pass that splits client vs Lua commands
    claim_calls: int  # timed claim calls at each queue size
    small: int  # the "1k" queue
    million: int  # the "1M" queue (0 skips it)
    models: int  # models the 1k / 1M queues spread over


FULL = Sizes(enqueue=20_000, bulk=100_000, batch=1000, drain=20_000, rq=20_000, latency=500,
             latency_warmup=30, warmup=1000, accounting=2000, claim_calls=3000, small=1000,
             million=1_000_000, models=100)
QUICK = Sizes(enqueue=1000, bulk=5000, batch=1000, drain=1000, rq=500, latency=60,
              latency_warmup=10, warmup=200, accounting=200, claim_calls=300, small=1000,
              million=20_000, models=100)


class Bench:
    """One run's context: the server, the sizes, fresh pool names, a bookkeeping client."""

    def __init__(self, server: EmbeddedServer, sizes: Sizes, repeat: int, log_dir: Path) -> None:
        self.server = server
        self.url = server.url
        self.sizes = sizes
        self.repeat = repeat
        self.log_dir = log_dir
        self.r: redis.Redis = connect(self.url)  # for INFO and bookkeeping: never in a timed loop
        self.seq = 0

    def name(self, tag: str) -> str:
        self.seq += 1
        return f"{tag}{self.seq}"

    def gpuq_queue(self, pool: str) -> Queue:
        return Queue.from_url(self.url, pool=pool)

    def field_values(self, keys: list[str], field: str) -> list[str]:
        """One field of many hashes, 2,000 per pipeline."""
        out: list[str] = []
        for i in range(0, len(keys), 2000):
            pipe = self.r.pipeline(transaction=False)
            for k in keys[i:i + 2000]:
                pipe.hget(k, field)
            out += [str(s) for s in pipe.execute()]
        return out
