"""One point of the scale benchmark: W workers, M models, N queued tasks on a fresh server.

Phases, in order (``measure``):

1. the fleet registers (``bench.scale_fleet``): Redis memory per worker;
2. N tasks are bulk-enqueued over the M models (uniform at random): memory per queued task;
3. the claiming workers in turn, 8 at a time: one claim each (timed from the client), then
   the ack of each claimed task, then one new task enqueued for each one's model (each
   model's queue keeps its size), until each verb has run ``calls`` times; INFO commandstats
   and the server's CPU are read around each verb's part, so each verb's figures have
   nothing else in them; then claims by a worker that holds nothing (cold);
4. lifecycles per second from a few processes (``bench.scale_load``), the queue kept at N;
5. a heartbeat from every worker (unmeasured: the fleet stays live), then one warm-up reaper
   round and ``reaper_rounds`` measured ones (``Reaper.round``), then the same with one
   tenant registered (tenancy on), which is removed after;
6. ``scrapes`` exporter scrapes (``generate_latest`` of the exporter's registry).

Server time per script call is ``cmdstat_fcall`` (or ``cmdstat_evalsha``) usec / calls: it
includes the commands the script runs (Redis counts them under their own names too:
``inner_us`` sums those), not the reading and parsing of the call or the writing of the
reply, which the server CPU figure (``used_cpu_user`` + ``used_cpu_sys``, per call) has as
well.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
from prometheus_client import generate_latest

from bench import scale_fleet, scale_load
from bench.common import log
from bench.scale_fleet import HANDLER, TASK_GB, model_name
from bench.stats import pct, server_cpu, usec_stats
from gpuq.client import Queue
from gpuq.config import Config
from gpuq.connection import connect
from gpuq.keys import Keys
from gpuq.lua_source import script_source
from gpuq.reaper.loop import Reaper
from gpuq.scripts import SCRIPT_NAMES, Calls, Scripts
from gpuq.tenants import Tenant, remove_tenant, set_tenant
from gpuq.views.exporter import Exporter

LEASE_S = 3600.0  # the fleet beats only at start and before the reaper rounds: no lease lapses
FILL_CHUNK = 10_000  # tasks per enqueue_many call while filling
COLD_BLOCK = 10  # cold claims per commandstats window
GROUP = 8  # claimers per window of the verbs' rounds


@dataclass(frozen=True)
class Sizes:
    calls: int  # sequential calls of each verb at a point
    load_s: float  # seconds of the lifecycle run
    procs: int  # processes of the lifecycle run
    reaper_rounds: int
    scrapes: int
    held: int = 2  # models each worker holds
    lane_every: int = 8  # every 8th worker is an idle online lane


@dataclass
class Tally:
    """One verb's calls and what the server spent on them, summed over windows."""

    calls: int = 0
    usec: int = 0  # cmdstat_fcall + cmdstat_evalsha: the scripts' time, their inner commands included
    inner_calls: int = 0
    inner_usec: int = 0
    cpu_s: float = 0.0
    latency_s: list[float] = field(default_factory=list)

    @contextmanager
    def window(self, r: redis.Redis) -> Iterator[None]:
        before, cpu0 = usec_stats(r), server_cpu(r)
        yield
        cpu1, after = server_cpu(r), usec_stats(r)
        for name, (calls, usec) in after.items():
            c0, u0 = before.get(name, (0, 0))
            if name == "script":
                self.calls, self.usec = self.calls + calls - c0, self.usec + usec - u0
            elif name != "info":
                self.inner_calls, self.inner_usec = self.inner_calls + calls - c0, self.inner_usec + usec - u0
        self.cpu_s += cpu1 - cpu0

    def report(self) -> dict[str, Any]:
        n = max(1, self.calls)
        out = {"calls": self.calls, "server_us": round(self.usec / n, 1),
               "inner_us": round(self.inner_usec / n, 1),
               "inner_commands": round(self.inner_calls / n, 2),
               "server_cpu_us": round(self.cpu_s / n * 1e6, 1)}
        if self.latency_s:
            out.update(p50_us=round(pct(self.latency_s, 50) * 1e6, 1),
                       p99_us=round(pct(self.latency_s, 99) * 1e6, 1))
        return out


class Point:
    """One (W, M, N) point on a fresh pool of the server at ``url``."""

    def __init__(self, url: str, workers: int, models: int, tasks: int, sizes: Sizes) -> None:
        self.workers, self.models, self.tasks, self.sizes = workers, models, tasks, sizes
        self.url = url
        self.pool = f"scale-{workers}w-{models}m-{tasks}n"
        self.config = Config(redis_url=url, pool=self.pool, lease_s=LEASE_S).validate()
        self.r = connect(url)  # INFO and bookkeeping
        self.client = connect(url)
        self.client.ping()  # connected now: its buffers are not counted as the fleet's memory
        self.keys = Keys(self.pool, self.config.prefix)
        self.scripts, self.calls = Scripts(self.client, self.keys), Calls(self.config)
        self.fleet = scale_fleet.plan(self.pool, workers, models, sizes.held, sizes.lane_every)
        self.claimers = [m for m in self.fleet if not m.lane]
        self.fresh = scale_fleet.fresh(self.pool)
        self.rng = random.Random(workers * 1_000_003 + models)

    def used_memory(self) -> int:
        return int(self.r.info("memory")["used_memory"])

    def register(self) -> dict[str, Any]:
        m0, t0 = self.used_memory(), time.perf_counter()
        scale_fleet.register(self.client, self.keys, self.config, self.fleet, self.scripts, self.calls)
        lanes = scale_fleet.idle_lanes(self.scripts, self.calls, self.fleet)
        per_worker = (self.used_memory() - m0) / self.workers
        scale_fleet.register(self.client, self.keys, self.config, [self.fresh], self.scripts, self.calls)
        held = [len(m.held) for m in self.fleet]
        holders = self.client.pipeline(transaction=False)
        for i in range(min(self.models, sum(held))):
            holders.scard(self.keys.holders(model_name(i)))
        counts = [int(c) for c in holders.execute()]
        return {"bytes_per_worker": round(per_worker),
                "idle_lanes": lanes, "claimers": len(self.claimers),
                "models_held": sum(1 for c in counts if c),
                "holders_per_held_model": round(statistics.fmean(counts), 1) if counts else 0.0,
                "register_s": round(time.perf_counter() - t0, 2)}

    def fill(self) -> dict[str, Any]:
        q = Queue(self.client, self.config)
        m0, t0 = self.used_memory(), time.perf_counter()
        for start in range(0, self.tasks, FILL_CHUNK):
            q.enqueue_many([{"handler": HANDLER, "payload": None, "vram_gb": TASK_GB,
                             "model": model_name(self.rng.randrange(self.models))}
                            for _ in range(start, min(self.tasks, start + FILL_CHUNK))])
        wall = time.perf_counter() - t0
        return {"bytes_per_task": round((self.used_memory() - m0) / self.tasks),
                "fill_per_s": round(self.tasks / wall), "fill_s": round(wall, 2)}

    def verbs(self) -> dict[str, Any]:
        """The claimers in turn, GROUP at a time: their claims, then the acks, then the
        enqueues, each verb's part in its own window. The group's size is the same at every
        W, so the verbs interleave alike at every point (a script runs faster many times in
        a row than between the others: measured with the whole fleet in one window, the
        smallest fleets' figures came out up to 1.5x the largest's)."""
        claim, ack, enqueue = Tally(), Tally(), Tally()
        warm = empty = turn = 0
        n = len(self.claimers)
        while claim.calls < self.sizes.calls:
            group = [self.claimers[(turn + k) % n] for k in range(min(GROUP, n))]
            turn += len(group)
            claimed: list[dict[str, str]] = []
            with claim.window(self.r):
                for member in group:
                    call = self.calls.claim(member.request)
                    t0 = time.perf_counter()
                    task = self.scripts.run(call).task
                    claim.latency_s.append(time.perf_counter() - t0)
                    if task is None:
                        empty += 1
                        continue
                    warm += task["model"] in member.held
                    claimed.append(task)
            self.settle(claimed, ack, enqueue)
        out = {"enqueue": enqueue.report(), "claim": claim.report(), "ack": ack.report(),
               "cold_claim": self.cold_claims()}
        out["claim"].update(warm_share=round(warm / max(1, claim.calls), 3), empty=empty)
        return out

    def settle(self, claimed: list[dict[str, str]], ack: Tally, enqueue: Tally) -> None:
        """Ack the claimed tasks, then enqueue one task for each one's model (each model's
        queue keeps its size), each verb in its own window."""
        with ack.window(self.r):
            for task in claimed:
                t0 = time.perf_counter()
                self.scripts.run(self.calls.ack(task["id"], int(task["token"]), "null"))
                ack.latency_s.append(time.perf_counter() - t0)
        specs = [scale_load.new_task(task["model"]) for task in claimed]
        with enqueue.window(self.r):
            for spec in specs:
                t0 = time.perf_counter()
                self.scripts.run(self.calls.enqueue([spec]))
                enqueue.latency_s.append(time.perf_counter() - t0)

    def cold_claims(self) -> dict[str, Any]:
        """Claims of the worker that holds nothing, COLD_BLOCK per window (its tasks acked and
        replaced outside the windows); "empty": claims that found nothing it should take."""
        cold, untimed = Tally(), Tally()
        empty = 0
        while cold.calls < max(COLD_BLOCK, self.sizes.calls // 10):
            claimed = []
            with cold.window(self.r):
                for _ in range(COLD_BLOCK):
                    call = self.calls.claim(self.fresh.request)
                    t0 = time.perf_counter()
                    task = self.scripts.run(call).task
                    cold.latency_s.append(time.perf_counter() - t0)
                    if task is None:
                        empty += 1
                    else:
                        claimed.append(task)
            self.settle(claimed, untimed, untimed)
        return {**cold.report(), "empty": empty}

    def lifecycles(self) -> dict[str, Any]:
        marks: dict[str, Any] = {}

        def before() -> None:
            marks["stats0"], marks["cpu0"] = usec_stats(self.r), server_cpu(self.r)

        def after() -> None:
            marks["cpu1"], marks["stats1"] = server_cpu(self.r), usec_stats(self.r)

        results, wall = scale_load.run(self.url, self.pool, LEASE_S, [m.request for m in self.claimers],
                                       self.sizes.procs, self.sizes.load_s, before, after)
        done = sum(int(x["lifecycles"]) for x in results)
        cpu = marks["cpu1"] - marks["cpu0"]
        calls, usec = marks["stats1"].get("script", (0, 0))
        c0, u0 = marks["stats0"].get("script", (0, 0))
        n = max(1, done)
        return {"lifecycles": done, "per_s": round(done / wall), "procs": len(results),
                "empty_claims": sum(int(x["empty_claims"]) for x in results),
                "server_cpu_us": round(cpu / n * 1e6, 1), "script_us": round((usec - u0) / n, 1),
                "script_calls_per_lifecycle": round((calls - c0) / n, 2),
                "per_server_cpu_s": round(done / cpu) if cpu > 0 else None,
                "redis_cpu_share": round(cpu / wall, 2), "wall_s": round(wall, 2)}

    def reaper(self) -> dict[str, Any]:
        """A heartbeat from every worker, one warm-up round, then the measured rounds, and
        each step of a round alone (as ``Reaper.round`` runs them) for where the time goes."""
        for member in [*self.fleet, self.fresh]:
            scale_fleet.beat(self.scripts, self.calls, self.keys, member,
                             scale_fleet.identity(member, self.config))
        reaper = Reaper(self.client, self.config)
        reaper.round()
        rounds = [timed(self.r, reaper.round) for _ in range(self.sizes.reaper_rounds)]
        out = median_of(rounds)
        steps = {"recover": reaper.reap_once, "schedules": reaper.fire_schedules,
                 "expire": reaper.expire, "preempt": reaper.preemptor.step, "scale": reaper.scaler.step}
        out["steps_server_cpu_ms"] = {name: round(timed(self.r, step)["server_cpu_ms"], 2)
                                      for name, step in steps.items()}
        # tenancy on (one tenant registered): the tenants step reads the live workers' slots
        queue = Queue(self.client, self.config)
        set_tenant(queue, Tenant("bench"))
        reaper.round()
        on = out["tenancy_on"] = median_of([timed(self.r, reaper.round)
                                             for _ in range(self.sizes.reaper_rounds)])
        on["tenants_step_server_cpu_ms"] = round(timed(self.r, reaper.room.step)["server_cpu_ms"], 2)
        remove_tenant(queue, "bench")
        return out

    def exporter(self) -> dict[str, Any]:
        registry = Exporter(self.client, self.keys).registry
        scrapes = []
        for _ in range(self.sizes.scrapes):
            t = Tally()
            with t.window(self.r):
                t0 = time.perf_counter()
                text = generate_latest(registry).decode()
                wall = time.perf_counter() - t0
            series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
            scrapes.append({"scrape_s": wall, "series": series, "server_cpu_ms": t.cpu_s * 1e3,
                            "bytes": len(text)})
        return median_of(scrapes)

    def close(self) -> None:
        self.client.close()
        self.r.close()


def timed(r: redis.Redis, step: Callable[[], object]) -> dict[str, float]:
    """What one call of ``step`` cost the server (CPU; script and other commands' usec), the
    commands it sent (those inside scripts included) and its wall time."""
    t = Tally()
    with t.window(r):
        t0 = time.perf_counter()
        step()
        wall = time.perf_counter() - t0
    return {"server_cpu_ms": t.cpu_s * 1e3, "script_ms": t.usec / 1e3,
            "other_commands_ms": t.inner_usec / 1e3, "wall_ms": wall * 1e3,
            "commands": t.calls + t.inner_calls}


def median_of(runs: list[dict[str, float]]) -> dict[str, Any]:
    """Each figure's median over the runs (rounded), and how many runs."""
    out: dict[str, Any] = {k: round(statistics.median(r[k] for r in runs), 4) for k in runs[0]}
    out["runs"] = len(runs)
    return out


def warm_up(url: str, r: redis.Redis) -> None:
    """A small throwaway point, then a flush: what the server allocates once (the scripts'
    first runs, its tables' first growth) is not counted in the first point's memory."""
    r.flushall()
    p = Point(url, 8, 10, 1000, Sizes(calls=1, load_s=0.0, procs=1, reaper_rounds=1, scrapes=1))
    try:
        p.register()
        p.fill()
        p.verbs()
    finally:
        p.close()


def measure(url: str, r: redis.Redis, workers: int, models: int, tasks: int, sizes: Sizes) -> dict[str, Any]:
    """Every figure of one point; the server is flushed first, so nothing else is in it."""
    r.flushall()
    for name in SCRIPT_NAMES:  # loaded before any memory is read: the script cache is not the pool's
        r.script_load(script_source(name))
    t0 = time.perf_counter()
    p = Point(url, workers, models, tasks, sizes)
    out: dict[str, Any] = {"workers": workers, "models": models, "tasks": tasks}
    try:
        label = f"W={workers} M={models} N={tasks}"
        for name, step in (("fleet", p.register), ("fill", p.fill), ("verbs", p.verbs),
                           ("lifecycle", p.lifecycles), ("reaper", p.reaper), ("exporter", p.exporter)):
            log(f"{label}: {name}")
            out[name] = step()
    finally:
        p.close()
    out["point_s"] = round(time.perf_counter() - t0, 1)
    return out
