"""gpuq's side: enqueue one by one and in bulk, a worker process's drain, enqueue->result."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from bench.common import MODEL, VRAM_GB, Bench, noop_tasks, round_trips
from bench.procs import GPUQ_SIM_ENV, children_cpu, finish, gpuq_worker_args, spawn, stop, wait_until
from bench.stats import Drain, Window, make_drain, maybe_window, ms_to_s, read_times, timed_rate, window
from gpuq.client import Queue
from gpuq.keys import Keys


def enqueue_one(b: Bench, n: int, windows: list[Window] | None = None) -> tuple[float, float]:
    """(tasks/s, client CPU µs per task) of ``Queue.enqueue`` in a loop on one connection."""
    q = b.gpuq_queue(b.name("enq"))
    for i in range(b.sizes.warmup):  # same connection, same pool shape; untimed
        q.enqueue("sim.noop", {"i": -i}, model=MODEL, vram_gb=VRAM_GB)

    def run() -> None:
        for i in range(n):
            q.enqueue("sim.noop", {"i": i}, model=MODEL, vram_gb=VRAM_GB)

    with maybe_window(b.r, windows):
        rate = timed_rate(n, run)
    q.close()
    return rate


def enqueue_bulk(b: Bench, n: int, windows: list[Window] | None = None) -> tuple[float, float]:
    """(tasks/s, client CPU µs per task) of ``Queue.enqueue_many`` in calls of ``batch``."""
    q = b.gpuq_queue(b.name("bulk"))
    size = b.sizes.batch
    q.enqueue_many([{"handler": "sim.noop", "payload": {"i": -i}, "model": MODEL, "vram_gb": VRAM_GB}
                    for i in range(min(b.sizes.warmup, size))])

    def run() -> None:
        for s in range(0, n, size):
            q.enqueue_many(noop_tasks(s, min(n, s + size)))

    with maybe_window(b.r, windows):
        rate = timed_rate(n, run)
    q.close()
    return rate


def fill(b: Bench, pool: str, n: int) -> list[str]:
    """Enqueue n no-op tasks into a pool (untimed); their ids."""
    q = b.gpuq_queue(pool)
    ids: list[str] = []
    for s in range(0, n, 5000):
        ids += [t.id for t in q.enqueue_many(noop_tasks(s, min(n, s + 5000)))]
    q.close()
    return ids


def drain(b: Bench, n: int, windows: list[Window] | None = None) -> Drain:
    """One burst worker process drains n pre-enqueued no-op tasks; timed from their records."""
    pool = b.name("drain")
    ids = fill(b, pool, n)
    keys = Keys(pool)
    own: list[Window] = []
    cpu0 = children_cpu()
    with window(b.r, own):
        p = spawn(gpuq_worker_args(b.url, pool, burst=True), b.log_dir, "gpuq-burst", GPUQ_SIM_ENV)
        wall = finish(p, 900, "gpuq burst worker")
    cpu = children_cpu() - cpu0
    if windows is not None:
        windows.extend(own)
    task_keys = [keys.task(i) for i in ids]
    starts, ends = read_times(b.r, task_keys, "started_at", "finished_at", ms_to_s)
    states = Counter(b.field_values(task_keys, "state"))
    if states != Counter({"succeeded": n}):
        raise RuntimeError(f"gpuq drain: task states {dict(states)}; expected {n} succeeded")
    return make_drain(n, starts, ends, wall, cpu, own[0])


@contextmanager
def idle_worker(b: Bench) -> Iterator[Queue]:
    """A gpuq worker process (not burst) that has come up and gone idle."""
    pool = b.name("lat")
    q = b.gpuq_queue(pool)
    worker = f"bench-lat-{pool}"
    p = spawn(gpuq_worker_args(b.url, pool, burst=False, name=worker), b.log_dir, "gpuq-idle",
              GPUQ_SIM_ENV)
    try:
        wait_until(lambda: q.redis.zscore(q.keys.idle, worker) is not None, 60, "gpuq idle worker", p)
        yield q
    finally:
        stop(p, "gpuq idle worker")
        q.close()


def samples(q: Queue, n: int, warm: int) -> list[float]:
    """Seconds from just before ``enqueue`` to the return of ``result``, after warm-up."""
    return round_trips("gpuq", lambda i: q.enqueue("sim.noop", {"i": i}, model=MODEL,
                                                   vram_gb=VRAM_GB).result(timeout=30), n, warm)


def latency(b: Bench, n: int, warm: int) -> list[float]:
    with idle_worker(b) as q:
        return samples(q, n, warm)
