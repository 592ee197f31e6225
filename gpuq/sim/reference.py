"""An offline reference for model loads: a trace's request order served from one cache.

The cache is the pool's usable VRAM (each GPU's total less the KV reserve, added up). A
request whose model is resident is warm; otherwise the model loads (one load, and the request
is a cold start), evicting resident models until it fits. ``belady`` evicts the model whose
next request is furthest away (it knows the future); ``lru`` the least recently requested.
Concurrency and placement are ignored: one request at a time, and a model only needs room in
the pool, not on one GPU. So it is a reference to compare policies against, not a bound none
can beat (docs/SIMULATOR.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuq.worker_record import usable_gb

NEVER = float("inf")  # the next request of a model requested no more


@dataclass(frozen=True)
class Request:
    model: str
    vram_gb: float  # its footprint if it loads the model (as the model cache takes it)
    priority: int


@dataclass
class Loads:
    loads: int
    cold_starts: list[int]  # per priority 0..3

    def report(self, rule: str, capacity_gb: float) -> dict[str, Any]:
        return {"rule": rule, "usable_gb": round(capacity_gb, 3), "loads": self.loads,
                "cold_starts": {f"P{p}": n for p, n in enumerate(self.cold_starts)}}


def next_uses(requests: Sequence[Request]) -> list[float]:
    """For each request, the index of the next request of the same model (NEVER if none)."""
    following: dict[str, float] = {}
    out = [NEVER] * len(requests)
    for i in range(len(requests) - 1, -1, -1):
        out[i] = following.get(requests[i].model, NEVER)
        following[requests[i].model] = i
    return out


def belady(requests: Sequence[Request], capacity_gb: float) -> Loads:
    """Belady's rule: on a miss, evict the resident model requested furthest in the future
    (ties: the least recently requested)."""
    nxt = next_uses(requests)
    resident: dict[str, tuple[float, float]] = {}  # model -> (footprint, next request)
    return _serve(requests, capacity_gb, resident, lambda i: nxt[i],
                  lambda: max(resident, key=lambda m: resident[m][1]))


def lru(requests: Sequence[Request], capacity_gb: float) -> Loads:
    """A pool-wide LRU: on a miss, evict the least recently requested model."""
    resident: OrderedDict[str, tuple[float, float]] = OrderedDict()
    return _serve(requests, capacity_gb, resident, float, lambda: next(iter(resident)))


def _serve(requests: Sequence[Request], capacity_gb: float, resident: dict[str, tuple[float, float]],
           key: Callable[[int], float], victim: Callable[[], str]) -> Loads:
    """Serve the requests in order; ``key(i)`` is what a resident model keeps for request i
    (re-inserted on every request, so an OrderedDict stays in recency order) and
    ``victim()`` names the model to evict."""
    counts = Loads(0, [0, 0, 0, 0])
    used = 0.0
    for i, r in enumerate(requests):
        if r.model in resident:
            footprint = resident.pop(r.model)[0]
            resident[r.model] = (footprint, key(i))
            continue
        counts.loads += 1
        counts.cold_starts[r.priority] += 1
        if r.vram_gb > capacity_gb + 1e-9:
            continue  # larger than the pool: loaded for this request, kept by none
        while used + r.vram_gb > capacity_gb + 1e-9:
            used -= resident.pop(victim())[0]
        resident[r.model] = (r.vram_gb, key(i))
        used += r.vram_gb
    return counts


def pool_usable_gb(gpus: Sequence[tuple[float, int]], kv_reserve_gb: float) -> float:
    """The VRAM tasks may use across the pool's workers, (total GB, GPUs) each: a group keeps
    the KV reserve on each of its GPUs."""
    return sum(usable_gb(gb, kv_reserve_gb * n) for gb, n in gpus)


def references(requests: Sequence[Request], gpus: Sequence[tuple[float, int]],
               kv_reserve_gb: float) -> dict[str, dict[str, Any]]:
    """The report's ``reference`` (Belady) and ``reference_lru`` for one request order, over
    the workers' (total GB, GPUs)."""
    capacity = pool_usable_gb(gpus, kv_reserve_gb)
    return {"reference": belady(requests, capacity).report("belady", capacity),
            "reference_lru": lru(requests, capacity).report("lru", capacity)}


def ratio(value: float, reference: float) -> float | None:
    """A policy's figure over the reference's (None when the reference's is zero)."""
    return round(value / reference, 3) if reference else None


def first_request_misses(requests: Sequence[Request], sla_s: float | None, priority: int,
                         shortest_load_s: Callable[[str], float]) -> int:
    """The requests at ``priority`` that miss their SLA in any replay: a replay starts with
    no model loaded, so the first request of each model waits for its load, a miss when
    even the model's shortest load is longer than the SLA. They cap the attainment any pool
    can reach (``gpuq simulate --find-gpus``)."""
    seen: set[str] = set()
    missed = 0
    for r in requests:
        if r.model not in seen:
            seen.add(r.model)
            missed += r.priority == priority and sla_s is not None and shortest_load_s(r.model) > sla_s
    return missed
