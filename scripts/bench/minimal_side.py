"""The minimal queue's side: the same enqueue, drain and latency runs as gpuq's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from bench.common import Bench, round_trips
from bench.minimal import Minimal
from bench.procs import children_cpu, finish, minimal_worker_args, spawn, stop, wait_until
from bench.stats import Drain, Window, make_drain, maybe_window, ms_to_s, read_times, timed_rate, window
from gpuq.connection import connect


def queue(b: Bench, tag: str) -> Minimal:
    return Minimal(connect(b.url), b.name(tag))


def enqueue_one(b: Bench, n: int, windows: list[Window] | None = None) -> tuple[float, float]:
    """(tasks/s, client CPU µs per task) of one pipelined HSET+ZADD per task."""
    mq = queue(b, "menq")
    for i in range(b.sizes.warmup):
        mq.enqueue("noop", {"i": -i})

    def run() -> None:
        for i in range(n):
            mq.enqueue("noop", {"i": i})

    with maybe_window(b.r, windows):
        rate = timed_rate(n, run)
    mq.close()
    return rate


def enqueue_bulk(b: Bench, n: int, windows: list[Window] | None = None) -> tuple[float, float]:
    """(tasks/s, client CPU µs per task) of one pipeline of ``batch`` HSET+ZADD pairs per call."""
    mq = queue(b, "mbulk")
    size = b.sizes.batch
    mq.enqueue_many([("noop", {"i": -i}) for i in range(min(b.sizes.warmup, size))])

    def run() -> None:
        for s in range(0, n, size):
            mq.enqueue_many([("noop", {"i": i}) for i in range(s, min(n, s + size))])

    with maybe_window(b.r, windows):
        rate = timed_rate(n, run)
    mq.close()
    return rate


def drain(b: Bench, n: int, windows: list[Window] | None = None) -> Drain:
    """One minimal worker process drains n pre-enqueued tasks; timed from their records."""
    mq = queue(b, "mdrain")
    ids: list[str] = []
    for s in range(0, n, 5000):
        ids += mq.enqueue_many([("noop", {"i": i}) for i in range(s, min(n, s + 5000))])
    own: list[Window] = []
    cpu0 = children_cpu()
    with window(b.r, own):
        p = spawn(minimal_worker_args(b.url, mq.name, burst=True), b.log_dir, "minimal-burst")
        wall = finish(p, 900, "minimal burst worker")
    cpu = children_cpu() - cpu0
    if windows is not None:
        windows.extend(own)
    starts, ends = read_times(b.r, [mq.task_key(i) for i in ids], "started_at", "finished_at", ms_to_s)
    mq.close()
    return make_drain(n, starts, ends, wall, cpu, own[0])


@contextmanager
def idle_worker(b: Bench) -> Iterator[Minimal]:
    """A minimal worker process (not burst) that has come up and blocks on BZPOPMIN."""
    mq = queue(b, "mlat")
    p = spawn(minimal_worker_args(b.url, mq.name, burst=False), b.log_dir, "minimal-idle")
    try:
        wait_until(lambda: mq.r.exists(mq.ready) == 1, 60, "minimal idle worker", p)
        yield mq
    finally:
        stop(p, "minimal idle worker")
        mq.close()


def samples(mq: Minimal, n: int, warm: int) -> list[float]:
    """Seconds from just before ``enqueue`` to the return of ``wait``, after warm-up."""
    return round_trips("minimal", lambda i: mq.wait(mq.enqueue("noop", {"i": i}), 30), n, warm)


def latency(b: Bench, n: int, warm: int) -> list[float]:
    with idle_worker(b) as mq:
        return samples(mq, n, warm)
