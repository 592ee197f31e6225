"""Claim round-trip latency with 1k and 1M tasks queued over 100 models.

Two claimers call ``claim.lua`` directly through gpuq's ``Scripts``/``Calls`` with the
arguments a worker with an 80 GB GPU sends. cold: holds no model, so the claim walks the
index of models with work and takes the oldest head. warm: holds one model (``m000``), so
the claim takes from its queue first. Each claim is followed (untimed) by its ack and by
one new task for the same model, so the queue keeps its size.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import redis

from bench.common import VRAM_GB, Bench
from bench.stats import pct, usec_window
from gpuq.client import Queue
from gpuq.scripts import Calls, ClaimRequest, Scripts

CLAIMERS = ("cold", "warm")
BLOCKS = 10  # timed calls run in this many blocks, sizes and claimers alternating


class ClaimPool:
    """One pool of queued tasks and its two claimers."""

    def __init__(self, label: str, q: Queue, models: list[str], n: int, fill_s: float,
                 mem_mb: float, part_rates: list[float]) -> None:
        self.label, self.q, self.models, self.n = label, q, models, n
        self.fill_s, self.mem_mb, self.part_rates = fill_s, mem_mb, part_rates
        self.scripts, self.calls = Scripts(q.redis, q.keys), Calls(q.config)
        pool = q.config.pool
        self.reqs = {
            "cold": ClaimRequest(f"bench-claimer-cold-{pool}", 75.0, 0.0, 1, ()),
            "warm": ClaimRequest(f"bench-claimer-warm-{pool}", 74.0, 1.0, 1, ((models[0], VRAM_GB),)),
        }
        self.samples: dict[str, list[float]] = {k: [] for k in CLAIMERS}
        self.server: dict[str, list[float]] = {k: [] for k in CLAIMERS}  # µs per claim, per run

    def claim(self, kind: str) -> dict[str, str]:
        task = self.scripts.run(self.calls.claim(self.reqs[kind])).task
        if task is None:
            raise RuntimeError(f"claim at {self.label}: nothing claimed")
        return task

    def replace(self, task: dict[str, str]) -> None:
        """Ack a claimed task and enqueue one for the same model: the queue keeps its size."""
        self.scripts.run(self.calls.ack(task["id"], int(task["token"]), "null"))
        self.q.enqueue("sim.noop", None, model=task["model"], vram_gb=VRAM_GB)

    def one(self, kind: str) -> float:
        """Seconds of one claim round trip (redis-py and the reply parse included)."""
        call = self.calls.claim(self.reqs[kind])
        a = time.perf_counter()
        task = self.scripts.run(call).task
        dt = time.perf_counter() - a
        if task is None:
            raise RuntimeError(f"claim at {self.label}: nothing claimed")
        self.replace(task)
        return dt

    def server_block(self, r: redis.Redis, kind: str, k: int) -> None:
        """Server µs per claim from INFO commandstats around k claims with nothing else."""
        stats: dict[str, tuple[int, int]] = {}
        with usec_window(r, stats):
            claimed = [self.claim(kind) for _ in range(k)]
        calls, usec = stats.get("script", (0, 0))
        if calls != k:
            raise RuntimeError(f"claim at {self.label}: {calls} script calls for {k} claims")
        self.server[kind].append(usec / k)
        for task in claimed:
            self.replace(task)

    def report(self) -> dict[str, Any]:
        q = self.q
        out: dict[str, Any] = {"queued": self.n, "models": len(self.models), "fill_s": round(self.fill_s, 2),
                               "fill_per_s": round(self.n / self.fill_s, 1),
                               "used_memory_mb": round(self.mem_mb, 1),
                               "fill_per_s_by_tenth": self.part_rates}
        for kind in CLAIMERS:
            v = self.samples[kind]
            out[kind] = {"calls": len(v), "mean_us": round(statistics.fmean(v) * 1e6, 1),
                         "p50_us": round(pct(v, 50) * 1e6, 1), "p99_us": round(pct(v, 99) * 1e6, 1),
                         "server_mean_us": round(statistics.fmean(self.server[kind]), 1),
                         "server_runs": len(self.server[kind])}
        out["queued_after"] = sum(int(q.redis.zcard(q.keys.queue(2, m))) for m in self.models)
        return out

    def close(self) -> None:
        self.q.close()


def claim_pool(b: Bench, n_tasks: int, label: str) -> ClaimPool:
    """A pool holding n_tasks no-op tasks over ``models`` models, filled by bulk enqueue in
    calls of 10,000; the fill rate of each tenth says whether enqueue slows as it grows."""
    pool = b.name(f"claim{label}")
    q = b.gpuq_queue(pool)
    models = [f"m{i:03d}" for i in range(b.sizes.models)]
    mem0 = int(b.r.info("memory")["used_memory"])
    t0 = t_part = time.perf_counter()
    part_rates = []
    part, since = max(10_000, n_tasks // 10), 0
    for start in range(0, n_tasks, 10_000):
        end = min(n_tasks, start + 10_000)
        q.enqueue_many([{"handler": "sim.noop", "payload": None, "model": models[i % len(models)],
                         "vram_gb": VRAM_GB} for i in range(start, end)])
        since += end - start
        if since >= part or end == n_tasks:
            now = time.perf_counter()
            part_rates.append(round(since / (now - t_part), 1))
            t_part, since = now, 0
    fill_s = time.perf_counter() - t0
    mem1 = int(b.r.info("memory")["used_memory"])
    return ClaimPool(label, q, models, n_tasks, fill_s, (mem1 - mem0) / 2**20, part_rates)


def claim_latency(b: Bench, pools: list[ClaimPool]) -> dict[str, Any]:
    """Mean µs per claim call (round trip) at each queue size, measured in alternating
    blocks so the machine's noise falls on every size alike; then the server-side µs
    of claim calls from INFO commandstats."""
    s = b.sizes
    per_block = max(1, s.claim_calls // BLOCKS)
    for cp in pools:  # warm-up: scripts loaded, connections open, caches hot
        for kind in CLAIMERS:
            for _ in range(min(200, s.claim_calls)):
                cp.one(kind)
    for _ in range(BLOCKS):
        for cp in pools:
            for kind in CLAIMERS:
                cp.samples[kind] += [cp.one(kind) for _ in range(per_block)]
    # server-side µs per claim: INFO commandstats around runs of 5 claims alone (then
    # their acks and replacements, outside the window), sizes and claimers alternating
    for _ in range(max(20, s.claim_calls // 15)):
        for cp in pools:
            for kind in CLAIMERS:
                cp.server_block(b.r, kind, 5)
    return {cp.label: cp.report() for cp in pools}
