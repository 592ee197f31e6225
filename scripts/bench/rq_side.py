"""rq's side: one SimpleWorker draining pre-enqueued no-op jobs, and its commands per job.

rq is an optional extra (``pip install 'gpuq[bench]'``); without it these figures are skipped.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import redis

from bench.common import Bench
from bench.monitor import CommandMonitor
from bench.procs import children_cpu, finish, rq_worker_args, spawn
from bench.stats import Drain, Window, make_drain, read_times, window

RQ_JOB = "bench.rq_side.rq_noop"  # imported by the rq worker through --path scripts/
RQ_VERSION: str | None = None
try:
    import rq as _rq

    RQ_VERSION = str(_rq.__version__)
except ImportError:  # an optional extra: gpuq[bench]
    pass
HAVE_RQ = RQ_VERSION is not None


def rq_noop(payload: Any = None) -> Any:
    """The rq job: returns its argument, like gpuq's ``sim.noop``."""
    return payload


def rq_time(v: Any) -> float:
    text = v.decode() if isinstance(v, bytes) else str(v)
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def drain(b: Bench, n: int, windows: list[Window] | None = None) -> Drain:
    """One ``rq worker --burst`` (SimpleWorker) drains n jobs; timed from the job hashes."""
    from rq import Queue as RqQueue

    conn = redis.Redis.from_url(b.url)  # rq wants bytes replies
    name = b.name("rq")
    q = RqQueue(name, connection=conn)
    own: list[Window] = []
    ids: list[str] = []
    for s in range(0, n, 1000):
        jobs = q.enqueue_many([RqQueue.prepare_data(RQ_JOB, args=({"i": i},))
                               for i in range(s, min(n, s + 1000))])
        ids += [j.id for j in jobs]
    cpu0 = children_cpu()
    with window(b.r, own):
        p = spawn(rq_worker_args(b.url, name), b.log_dir, "rq-burst")
        wall = finish(p, 1800, "rq burst worker")
    cpu = children_cpu() - cpu0
    if windows is not None:
        windows.extend(own)
    starts, ends = read_times(conn, [f"rq:job:{i}" for i in ids], "started_at", "ended_at", rq_time)
    conn.close()
    return make_drain(n, starts, ends, wall, cpu, own[-1])


def accounting(b: Bench, mon: CommandMonitor, n: int) -> dict[str, Any]:
    """rq's commands per job: one-by-one enqueue plus the drain, in one MONITOR phase."""
    from rq import Queue as RqQueue

    w: list[Window] = []
    conn = redis.Redis.from_url(b.url)
    rq_name = b.name("rqacc")
    rq_q = RqQueue(rq_name, connection=conn)
    with mon.phase("rq-task", b.r, w):
        for i in range(n):
            rq_q.enqueue(RQ_JOB, {"i": i})
        finish(spawn(rq_worker_args(b.url, rq_name), b.log_dir, "rq-acc"), 600,
               "rq burst worker (accounting)")
    left = rq_q.count
    conn.close()
    if left:
        raise RuntimeError(f"rq accounting: {left} jobs left in the queue")
    client, lua, by_name = mon.split("rq-task")
    return {"task_client": round(client / n, 2), "task_total": round((client + lua) / n, 2),
            "cmdstat_total_per_task": round(w[0].total / n, 2),
            "client_by_command": {k: round(v / n, 3) for k, v in by_name.items()}}
