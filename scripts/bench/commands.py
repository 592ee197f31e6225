"""What a task costs Redis: commands per task (client-issued vs inside Lua, from a MONITOR
pass) and server time per script call (INFO commandstats, each step alone)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench import bullmq_side, gpuq_side, minimal_side, rq_side
from bench.common import MODEL, VRAM_GB, Bench, dumps, noop_tasks
from bench.monitor import CommandMonitor
from bench.procs import GPUQ_SIM_ENV, finish, gpuq_worker_args, minimal_worker_args, spawn
from bench.stats import Window, script_profile, usec_window
from gpuq.scripts import ClaimRequest

PHASES = ("enqueue", "bulk", "claim_ack", "latency")


def latency_tasks(n: int) -> int:
    return max(20, n // 20)


def gpuq_phases(b: Bench, mon: CommandMonitor, n: int) -> list[Window]:
    """gpuq's enqueue, bulk enqueue, burst drain and latency loop, each a MONITOR phase."""
    w: list[Window] = []
    enq, bulk = b.gpuq_queue(b.name("acc")), b.gpuq_queue(b.name("accb"))
    with mon.phase("gpuq-enqueue", b.r, w):
        for i in range(n):
            enq.enqueue("sim.noop", {"i": i}, model=MODEL, vram_gb=VRAM_GB)
    with mon.phase("gpuq-bulk", b.r, w):
        bulk.enqueue_many(noop_tasks(0, n))
    with mon.phase("gpuq-claim_ack", b.r, w):
        p = spawn(gpuq_worker_args(b.url, enq.config.pool, burst=True), b.log_dir, "gpuq-acc",
                  GPUQ_SIM_ENV)
        finish(p, 600, "gpuq burst worker (accounting)")
    with gpuq_side.idle_worker(b) as lq:
        gpuq_side.samples(lq, 3, 0)  # the model load is not what this counts
        with mon.phase("gpuq-latency", b.r, w):
            gpuq_side.samples(lq, latency_tasks(n), 0)
    enq.close()
    bulk.close()
    return w


def minimal_phases(b: Bench, mon: CommandMonitor, n: int) -> list[Window]:
    """The minimal queue's same four phases."""
    w: list[Window] = []
    menq, mbulk = minimal_side.queue(b, "macc"), minimal_side.queue(b, "maccb")
    with mon.phase("minimal-enqueue", b.r, w):
        for i in range(n):
            menq.enqueue("noop", {"i": i})
    with mon.phase("minimal-bulk", b.r, w):
        mbulk.enqueue_many([("noop", {"i": i}) for i in range(n)])
    with mon.phase("minimal-claim_ack", b.r, w):
        p = spawn(minimal_worker_args(b.url, menq.name, burst=True), b.log_dir, "minimal-acc")
        finish(p, 600, "minimal burst worker (accounting)")
    with minimal_side.idle_worker(b) as lmq:
        minimal_side.samples(lmq, 3, 0)
        with mon.phase("minimal-latency", b.r, w):
            minimal_side.samples(lmq, latency_tasks(n), 0)
    menq.close()
    mbulk.close()
    return w


def bullmq_phases(bq: bullmq_side.BullMQ, b: Bench, mon: CommandMonitor, n: int) -> list[Window]:
    """BullMQ's enqueue (``add`` one by one), bulk (one ``addBulk`` of n) and drain (one worker
    process, concurrency 1) as MONITOR phases; node start-up and connection set-up included."""
    w: list[Window] = []
    enq, bulk = b.name("bullacc"), b.name("bullaccb")
    with mon.phase("bullmq-enqueue", b.r, w):
        bq.produce(b, enq, "one", n, 1, 0)
    with mon.phase("bullmq-bulk", b.r, w):
        bq.produce(b, bulk, "bulk", n, n, 0)
    with mon.phase("bullmq-claim_ack", b.r, w):
        bq.worker(b, enq, n, "bullmq worker (accounting)")
    bullmq_side.completed_keys(b, enq, n)
    return w


def per_task(mon: CommandMonitor, kind: str, windows: list[Window], n: int) -> dict[str, Any]:
    """Each phase's commands per task, client and Lua, and the task's total (enqueue + drain)."""
    phases: dict[str, Any] = {}
    for ph, win in zip(PHASES, windows):
        client, lua, by_name = mon.split(f"{kind}-{ph}")
        per = latency_tasks(n) if ph == "latency" else n
        phases[ph] = {"client_per_task": round(client / per, 3), "lua_per_task": round(lua / per, 3),
                      "total_per_task": round((client + lua) / per, 3),
                      "cmdstat_total_per_task": round(win.total / per, 3),
                      "client_by_command": {k: round(v / per, 3) for k, v in by_name.items()}}
    phases["task_client"] = round(phases["enqueue"]["client_per_task"]
                                  + phases["claim_ack"]["client_per_task"], 2)
    phases["task_total"] = round(phases["enqueue"]["total_per_task"]
                                 + phases["claim_ack"]["total_per_task"], 2)
    return phases


def accounting(b: Bench, n: int, bq: bullmq_side.BullMQ | None = None) -> dict[str, Any]:
    """Client round trips vs Lua-internal commands per task, from one MONITOR pass (BullMQ's
    with ``bq``: its phases stop at claim_ack, it has no latency loop here)."""
    mon = CommandMonitor(b.server.port)
    out: dict[str, Any] = {}
    try:
        out["gpuq"] = per_task(mon, "gpuq", gpuq_phases(b, mon, n), n)
        out["minimal"] = per_task(mon, "minimal", minimal_phases(b, mon, n), n)
        if rq_side.HAVE_RQ:
            out["rq"] = rq_side.accounting(b, mon, n)
        if bq is not None:
            out["bullmq"] = per_task(mon, "bullmq", bullmq_phases(bq, b, mon, n), n)
    finally:
        mon.close()
    return out


def profiled(b: Bench, n: int, steps: Callable[[], None]) -> dict[str, float]:
    """The script profile of ``steps()`` (n script calls) run alone."""
    stats: dict[str, tuple[int, int]] = {}
    with usec_window(b.r, stats):
        t0 = time.perf_counter()
        steps()
        wall = time.perf_counter() - t0
    return script_profile(stats, n, wall)


def gpuq_server_time(b: Bench, n: int) -> dict[str, Any]:
    """n enqueues, then n claims by a worker identity holding the model, then n acks."""
    q = b.gpuq_queue(b.name("prof"))
    req = ClaimRequest(f"bench-prof-{q.config.pool}", 74.0, 1.0, 1, ((MODEL, VRAM_GB),))
    claimed: list[tuple[str, int]] = []

    def enqueues() -> None:
        for i in range(n):
            q.enqueue("sim.noop", {"i": i}, model=MODEL, vram_gb=VRAM_GB)

    def claims() -> None:
        for _ in range(n):
            task = q.scripts.run(q.calls.claim(req)).task
            if task is None:
                raise RuntimeError("server time: nothing to claim")
            claimed.append((task["id"], int(task["token"])))

    def acks() -> None:
        for task_id, token in claimed:
            q.scripts.run(q.calls.ack(task_id, token, dumps({"i": 0})))

    out = {"enqueue": profiled(b, n, enqueues), "claim": profiled(b, n, claims),
           "ack": profiled(b, n, acks)}
    q.close()
    return out


def minimal_server_time(b: Bench, n: int) -> dict[str, Any]:
    """The minimal queue's n enqueues (HSET+ZADD, no script), n claims, n acks."""
    mq = minimal_side.queue(b, "mprof")
    ids: list[str] = []
    stats: dict[str, tuple[int, int]] = {}
    with usec_window(b.r, stats):
        t0 = time.perf_counter()
        for i in range(n):
            mq.enqueue("noop", {"i": i})
        wall = time.perf_counter() - t0
    enqueue = {"calls": n, "server_us": round(sum(u for _, u in stats.values()) / n, 1),
               "commands": round(sum(c for c, _ in stats.values()) / n, 2),
               "round_trip_us": round(wall / n * 1e6, 1)}

    def claims() -> None:
        for _ in range(n):
            fields = mq.claim("bench-prof")
            if fields is None:
                raise RuntimeError("server time: minimal queue empty")
            ids.append(fields["id"])

    def acks() -> None:
        for task_id in ids:
            mq.ack(task_id, dumps({"i": 0}))

    out = {"enqueue": enqueue, "claim": profiled(b, n, claims), "ack": profiled(b, n, acks)}
    mq.close()
    return out


def server_time(b: Bench, n: int) -> dict[str, Any]:
    """Server µs per call of each step of a task (enqueue, claim, ack), gpuq and minimal.

    Each step runs n times in a row, alone, from this process, and INFO commandstats over
    that window gives the script's mean execution time and its inner commands' share. No
    SLOWLOG or MONITOR is on, so nothing inflates the script times.
    """
    out = {"gpuq": gpuq_server_time(b, n), "minimal": minimal_server_time(b, n)}
    for k in ("gpuq", "minimal"):
        out[k]["per_task_server_us"] = round(sum(v["server_us"] for v in out[k].values()), 1)
    return out
