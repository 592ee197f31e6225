#!/usr/bin/env python
"""Task lifecycles per second with pools spread across a three-master Redis Cluster, against
the same pools on one Redis server, in one run.

Each target gets ``--pools`` pools (on the cluster: one per master, by hash slot, as
tests/cluster3.py's ``pool_on`` picks them; on the single server: the same names). Per pool
one worker process (``python -m gpuq ... worker --app workers.sim:app``, no-op tasks, model
loads instant) starts and goes idle, then one producer process per pool enqueues ``--tasks``
no-op tasks one by one (``Queue.enqueue``: a round trip each). A lifecycle is one task's
enqueue, claim (or hand-over) and ack. Rates come from the task records (enqueued_at,
finished_at, stamped from each server's clock): per pool, the tasks enqueued after its first
``warm`` from that enqueue to the pool's last ack; aggregate, the acks of every pool within the
window all pools were running (the latest warm-up end to the earliest last ack). INFO
commandstats and INFO cpu of each master (or of the server) over the run give the server's
µs per lifecycle.

The single-server run then measures the background work a pool costs, from INFO commandstats
over windows of ``--idle-s`` seconds: its idle workers (heartbeat every 5 s, an idle claim
after each 5-s block); then, those stopped, as many busy workers, each on a pool of its own
running one task longer than the window (heartbeat with its lease); then one reaper per busy
pool added (a round a second).

    python scripts/bench_cluster.py                   # 10,000 tasks per pool (~2.5 min)
    python scripts/bench_cluster.py --tasks 2000 --json

The cluster is six redis-server nodes (three masters, a replica each) on loopback ports
(tests/cluster3.py); every node, worker and producer started here is stopped at the end,
each wait bounded by ``--timeout``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import redis
from bench import ROOT
from bench.common import MODEL, VRAM_GB, log
from bench.procs import GPUQ_SIM_ENV, Proc, finish, gpuq_worker_args, spawn, stop, wait_until
from bench.stats import pct, usec_stats, warm_count

from gpuq.client import Queue
from gpuq.embedded import EmbeddedServer
from gpuq.keys import Keys

sys.path.insert(0, str(ROOT / "tests"))
from cluster3 import Cluster3  # type: ignore[import-untyped]  # noqa: E402


def produce(url: str, pool: str, n: int, out: str) -> int:
    """The producer process: n no-op tasks one by one, then their ids into ``out``."""
    q = Queue.from_url(url, pool=pool)
    ids = [q.enqueue("sim.noop", {"i": i}, model=MODEL, vram_gb=VRAM_GB).id for i in range(n)]
    q.close()
    Path(out).write_text("\n".join(ids))
    return 0


def server_load(nodes: list[redis.Redis]) -> dict[str, float]:
    """Summed over nodes: every command's calls and µs (INFO commandstats), CPU seconds."""
    calls = usec = 0
    cpu = 0.0
    for r in nodes:
        for name, (c, u) in usec_stats(r).items():
            if name != "info":
                calls, usec = calls + c, usec + u
        info = r.info("cpu")
        cpu += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return {"calls": calls, "usec": usec, "cpu_s": cpu}


def connections(nodes: list[redis.Redis]) -> int:
    return sum(int(r.info("clients")["connected_clients"]) for r in nodes)


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


@contextmanager
def processes() -> Iterator[list[Proc]]:
    """Every process started in the block is stopped when it ends, whatever happens."""
    procs: list[Proc] = []
    try:
        yield procs
    finally:
        for p in procs:
            stop(p, "bench process")


def is_idle(r: redis.Redis, keys: Keys, worker: str) -> bool:
    return r.zscore(keys.idle, worker) is not None


def has_state(r: redis.Redis, keys: Keys, task_id: str, state: str) -> bool:
    return bool(r.hget(keys.task(task_id), "state") == state)


def times(r: redis.Redis, keys: Keys, ids: list[str]) -> list[tuple[float, float, str]]:
    """(enqueued_at, finished_at, state) of each task, seconds."""
    out: list[tuple[float, float, str]] = []
    for i in range(0, len(ids), 2000):
        pipe = r.pipeline(transaction=False)
        for task_id in ids[i:i + 2000]:
            pipe.hmget(keys.task(task_id), "enqueued_at", "finished_at", "state")
        for e, f, s in pipe.execute():
            out.append((int(e) / 1000, int(f) / 1000 if f else float("nan"), str(s)))
    return out


def rates(records: dict[str, list[tuple[float, float, str]]]) -> dict[str, Any]:
    """Per pool and aggregate lifecycles/s from the task records (see the module's doc)."""
    pools: dict[str, Any] = {}
    starts, ends = [], []
    for pool, recs in records.items():
        enq = sorted(e for e, _, _ in recs)
        fin = sorted(f for _, f, _ in recs)
        warm = warm_count(len(recs))
        t0, last = enq[warm], fin[-1]
        lat = sorted((f - e) * 1000 for e, f, _ in recs)
        pools[pool] = {"tasks": len(recs), "per_s": round((len(recs) - warm) / (last - t0), 1),
                       "enqueue_to_finish_ms_p50": round(pct(lat, 50), 2),
                       "enqueue_to_finish_ms_p99": round(pct(lat, 99), 2)}
        starts.append(t0)
        ends.append(last)
    t0, t1 = max(starts), min(ends)
    for pool, recs in records.items():
        done = sum(1 for _, f, _ in recs if t0 <= f <= t1)
        pools[pool]["per_s_common_window"] = round(done / (t1 - t0), 1) if t1 > t0 else None
    total = sum(1 for recs in records.values() for _, f, _ in recs if t0 <= f <= t1)
    return {"aggregate_per_s": round(total / (t1 - t0), 1) if t1 > t0 else None,
            "window_s": round(t1 - t0, 3), "pools": pools}


def run_target(url: str, pools: list[str], client_of: Callable[[str], redis.Redis],
               masters: list[redis.Redis], n: int, timeout: float, tmp: Path,
               idle_s: float = 0.0, replicas: list[redis.Redis] | None = None) -> dict[str, Any]:
    """Idle workers, then producers into every pool at once; the rates and the servers' load;
    with idle_s, the background measurement after it."""
    with processes() as procs:
        for pool in pools:
            procs.append(spawn(gpuq_worker_args(url, pool, burst=False, name=f"bw-{pool}"), tmp,
                               f"worker-{pool}", GPUQ_SIM_ENV))
        for pool, p in zip(pools, procs):
            keys, r = Keys(pool), client_of(pool)
            wait_until(partial(is_idle, r, keys, f"bw-{pool}"), timeout,
                       f"worker of {pool} idle", p)
        before = server_load(masters)
        each = [server_load([m]) for m in masters]
        copies0 = server_load(replicas) if replicas else {}
        started = time.monotonic()
        producers = [spawn([sys.executable, __file__, "--produce", url, pool, str(n), str(tmp / pool)],
                           tmp, f"producer-{pool}") for pool in pools]
        procs += producers
        for pool, p in zip(pools, producers):
            finish(p, timeout, f"producer of {pool}")
        records = {}
        for pool in pools:
            ids = (tmp / pool).read_text().split("\n")
            keys, r = Keys(pool), client_of(pool)
            wait_until(partial(has_state, r, keys, ids[-1], "succeeded"), timeout,
                       f"the last task of {pool}")
            records[pool] = times(r, keys, ids)
            failed = [s for _, _, s in records[pool] if s != "succeeded"]
            if failed:
                raise RuntimeError(f"{pool}: {len(failed)} tasks not succeeded ({failed[0]})")
        wall = time.monotonic() - started
        load = delta(server_load(masters), before)
        mine = [delta(server_load([m]), b) for m, b in zip(masters, each)]
        copies = delta(server_load(replicas), copies0) if replicas else None
        idle = background(url, pools, masters, procs, tmp, idle_s) if idle_s else None
    out = rates(records)
    total = n * len(pools)
    out.update({"wall_s": round(wall, 2), "server_us_per_task": round(load["usec"] / total, 1),
                "server_cpu_us_per_task": round(load["cpu_s"] * 1e6 / total, 1),
                "commands_per_task": round(load["calls"] / total, 2),
                # each master's own pools (spread evenly): its µs per task of theirs
                "server_us_per_task_by_node": [round(m["usec"] * len(mine) / total, 1) for m in mine],
                "server_cpu_s_by_node": [round(m["cpu_s"], 2) for m in mine]})
    if copies is not None:  # what the replicas' copying cost their own processes
        out["replica_cpu_us_per_task"] = round(copies["cpu_s"] * 1e6 / total, 1)
    if idle is not None:
        out["background"] = idle
    return out


def background(url: str, pools: list[str], masters: list[redis.Redis], procs: list[Proc],
               tmp: Path, span: float) -> dict[str, Any]:
    """Server µs per second of the pools' idle workers (``procs`` starts with them); then,
    those stopped, of as many busy workers, each on a pool of its own running one long
    task; then of one reaper per busy pool added."""
    time.sleep(1.0)  # the last acks' aftermath (idle checks, wake-up lists) settles

    def measure() -> dict[str, float]:
        before = server_load(masters)
        time.sleep(span)
        return delta(server_load(masters), before)

    idle = measure()
    idle_conns = connections(masters)
    for p in procs[:len(pools)]:
        stop(p, "idle worker")
    base_conns = connections(masters)  # the bench's own
    busy_pools = [f"{p}-busy" for p in pools]
    busy(url, busy_pools, masters[0], procs, tmp, span)
    working = measure()
    busy_conns = connections(masters)
    for pool in busy_pools:
        procs.append(spawn([sys.executable, "-m", "gpuq", "--redis", url, "--pool", pool, "reaper"],
                           tmp, f"reaper-{pool}"))
    time.sleep(2.0)  # start-up and the first round's lead election
    reapers = measure()
    w, k = len(pools), span

    def per(now: dict[str, float], then: dict[str, float] | None = None) -> tuple[float, float]:
        base = then or {"usec": 0.0, "calls": 0.0}
        return (round((now["usec"] - base["usec"]) / k / w, 1),
                round((now["calls"] - base["calls"]) / k / w, 2))

    out: dict[str, Any] = {"seconds": span, "workers": w,
                           "connections_per_idle_worker": (idle_conns - base_conns) / w,
                           "connections_per_busy_worker": (busy_conns - base_conns) / w}
    for name, (us, calls) in (("idle_worker", per(idle)), ("busy_worker", per(working)),
                              ("reaper", per(reapers, working))):
        out[f"{name}_us_per_s"], out[f"{name}_commands_per_s"] = us, calls
    return out


def busy(url: str, pools: list[str], r: redis.Redis, procs: list[Proc], tmp: Path,
         span: float) -> None:
    """A worker per pool (model loads of a second, not instant) running one task that lasts
    past the window; returns once every task runs and its model has loaded."""
    for pool in pools:
        procs.append(spawn(gpuq_worker_args(url, pool, burst=False, name=f"bw-{pool}"), tmp,
                           f"busy-{pool}", {"GPUQ_SIM_TIME_SCALE": "1"}))
    for pool, p in zip(pools, procs[-len(pools):]):
        keys = Keys(pool)
        wait_until(partial(is_idle, r, keys, f"bw-{pool}"), 60, f"busy worker of {pool}", p)
        with Queue.from_url(url, pool=pool) as q:
            task_id = q.enqueue("sim.run", {}, model="bench-busy", vram_gb=VRAM_GB, est_s=span + 60).id
        wait_until(partial(has_state, r, keys, task_id, "running"), 60, f"the task of {pool}", p)
    time.sleep(2.0)  # the model's load (1 s) and the first beat with the lease


def single(args: argparse.Namespace, names: list[str], tmp: Path) -> dict[str, Any]:
    server = EmbeddedServer("redis").start()
    try:
        r = redis.Redis.from_url(server.url, decode_responses=True)
        try:
            return run_target(server.url, names, lambda _p: r, [r], args.tasks, args.timeout, tmp,
                              args.idle_s)
        finally:
            r.close()
    finally:
        server.stop()


def cluster(args: argparse.Namespace, tmp: Path) -> tuple[list[str], dict[str, Any]]:
    with Cluster3() as c:
        masters = c.masters()
        pools = [c.pool_on(masters[i % 3], stem=f"bc{i}-") for i in range(args.pools)]
        nodes = [c.node_client(m) for m in masters]
        copies = [c.node_client(r) for m in masters for r in c.replicas_of(m)]
        clients = {p: c.client(p) for p in pools}
        try:
            out = run_target(c.url, pools, clients.__getitem__, nodes, args.tasks, args.timeout, tmp,
                             replicas=copies)
            out["owners"] = {p: c.owner(p) for p in pools}
            return pools, out
        finally:
            for x in [*nodes, *copies, *clients.values()]:
                x.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=10_000, help="tasks per pool")
    ap.add_argument("--pools", type=int, default=3, help="pools (spread over the 3 masters)")
    ap.add_argument("--idle-s", type=float, default=20.0, help="seconds of each background window")
    ap.add_argument("--timeout", type=float, default=300.0, help="bound of every wait, seconds")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--produce", nargs=4, metavar=("URL", "POOL", "N", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.produce:
        url, pool, n, out = args.produce
        return produce(url, pool, int(n), out)
    if args.tasks < 100 or args.pools < 1 or args.idle_s < 0:
        ap.error("--tasks must be >= 100, --pools >= 1, --idle-s >= 0")
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as d:
        log(f"cluster: {args.pools} pools, {args.tasks} tasks each")
        pools, on_cluster = cluster(args, Path(d))
        log(f"single server: the same pools {pools}")
        on_single = single(args, pools, Path(d))
    res = {"args": {k: v for k, v in vars(args).items() if k != "produce"}, "cluster": on_cluster,
           "single": on_single,
           "cluster_over_single": round(on_cluster["aggregate_per_s"] / on_single["aggregate_per_s"], 2)
           if on_cluster["aggregate_per_s"] and on_single["aggregate_per_s"] else None}
    print(json.dumps(res, indent=2) if args.json else table(res))
    return 0


def table(res: dict[str, Any]) -> str:
    lines = [f"{'TARGET':<9}{'POOL':<10}{'TASKS/S':>9}{'IN WINDOW':>10}{'P50 MS':>8}{'P99 MS':>8}"]
    for target in ("cluster", "single"):
        r = res[target]
        for pool, p in r["pools"].items():
            lines.append(f"{target:<9}{pool:<10}{p['per_s']:>9.1f}{p['per_s_common_window'] or 0:>10.1f}"
                         f"{p['enqueue_to_finish_ms_p50']:>8.2f}{p['enqueue_to_finish_ms_p99']:>8.2f}")
        lines.append(f"{target:<9}{'all':<10}{'':>9}{r['aggregate_per_s'] or 0:>10.1f}   server "
                     f"{r['server_us_per_task']} µs, {r['commands_per_task']} commands per task")
    bg = res["single"].get("background")
    if bg:
        lines.append(f"background, server µs/s: an idle worker {bg['idle_worker_us_per_s']}, a reaper "
                     f"{bg['reaper_us_per_s']}, a busy worker {bg['busy_worker_us_per_s']}")
    lines.append(f"cluster / single, aggregate: {res['cluster_over_single']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
