"""A simulated fleet for the scale benchmark: W workers registered as real workers register.

Each worker writes what ``gpuq.worker.loop`` writes at start-up: ``Presence.register`` with
``worker_record.identity`` of a declared 80 GB GPU, then a first heartbeat (heartbeat.lua and
the hash's HSET in one round trip, as ``Heartbeat.beat``), then its held models as a model
load leaves them (holders sets, the hash's models and free VRAM, the catalog's load record,
as ``Executor`` and ``Presence.show``). Nothing runs on a GPU and nothing sleeps.

Holdings: worker i holds models (i*H + j) mod M for j < H, so each model is held by about
W*H/M workers (at least one while W*H < M covers the first W*H models). A share of the fleet
are online lanes (levels "0", the same holdings) that find no work in this benchmark: their
one claim leaves them in the idle set, where enqueue's and claim's wake rule look (idle
holders, the tightest idle fit) for every task, as in a pool where some GPUs idle. One more
worker, outside W, holds nothing (``fresh``): its claims are the cold ones.
"""

from __future__ import annotations

import itertools
import os
import socket
from dataclasses import dataclass

import redis

from gpuq import catalog, worker_record
from gpuq.config import Config
from gpuq.keys import Keys
from gpuq.scripts import Calls, ClaimRequest, Scripts
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.presence import Presence

GPU = GpuInfo(name="bench-80GB", uuid="", total_gb=80.0, index=None, source="declared")
FOOTPRINT_GB = 20.0  # every model's weights
TASK_GB = 24.0  # every task's need: its model's weights and 4 GB of working memory
HANDLER = "sim.noop"
LOAD_S = 12.0  # the load time each held model's catalog entry records


def model_name(i: int) -> str:
    return f"m{i:05d}"


@dataclass(frozen=True)
class Member:
    """One simulated worker: its id, what it holds and what it sends the claim script."""

    worker_id: str
    lane: bool  # an online lane (levels "0"): idles in this benchmark
    held: tuple[str, ...]
    request: ClaimRequest


def plan(pool: str, workers: int, models: int, held_per_worker: int, lane_every: int) -> list[Member]:
    """The fleet: every ``lane_every``-th worker (from the first) is a lane; 0: none."""
    config = Config()
    usable = GPU.total_gb - GPU.reserve_gb(config.kv_reserve_gb)
    out = []
    for i in range(workers):
        held = tuple(dict.fromkeys(model_name((i * held_per_worker + j) % models)
                                   for j in range(held_per_worker)))
        lane = lane_every > 0 and i % lane_every == 0
        free = usable - FOOTPRINT_GB * len(held)
        req = ClaimRequest(f"w{i:05d}-{pool}", free, FOOTPRINT_GB * len(held), 1,
                           tuple((m, FOOTPRINT_GB) for m in held), levels="0" if lane else "0123")
        out.append(Member(req.worker_id, lane, held, req))
    return out


def fresh(pool: str) -> Member:
    """A worker that holds no model (just started, or its models evicted): its claims are
    all cold, so they take the wake rule's paths (idle holders, busy holders, the tightest
    idle fit) for every task they look at."""
    usable = GPU.total_gb - GPU.reserve_gb(Config().kv_reserve_gb)
    req = ClaimRequest(f"fresh-{pool}", usable, 0.0, 1, ())
    return Member(req.worker_id, False, (), req)


def identity(member: Member, config: Config) -> worker_record.Fields:
    """The identity of a non-burst worker (it takes hand-overs) running the sim app."""
    handover = (int(config.defer_s * 1000), config.fair_every, int(config.lease_s * 1000))
    return worker_record.identity(member.worker_id, GPU, config.kv_reserve_gb, config.concurrency,
                                  member.request.levels, socket.gethostname(), os.getpid(),
                                  handover, (HANDLER,))


def register(client: redis.Redis, keys: Keys, config: Config, fleet: list[Member],
             scripts: Scripts, calls: Calls) -> None:
    """Register, beat once and hold models, worker by worker, as each would at start-up."""
    lease_ms = int(config.lease_s * 1000)
    for member in fleet:
        presence = Presence(client, keys, member.worker_id)
        ident = identity(member, config)
        presence.register(ident, lease_ms)
        beat(scripts, calls, keys, member, ident)
        pipe = presence.pipeline()
        for model in member.held:  # what a model load leaves (Executor.load, Presence.show)
            catalog.record_load(pipe, keys, model, FOOTPRINT_GB, LOAD_S)
            presence.hold(pipe, model, True)
        pipe.hset(keys.worker(member.worker_id),
                  mapping=worker_record.model_fields(member.request.free_gb, list(member.held)))
        pipe.execute()


def beat(scripts: Scripts, calls: Calls, keys: Keys, member: Member, ident: worker_record.Fields,
         leases: tuple[tuple[str, int], ...] = ()) -> None:
    """One heartbeat as ``Heartbeat.beat`` sends it: the script and the hash's rewrite."""
    fields = {**ident, **worker_record.status_fields(member.request.free_gb, len(leases),
                                                     list(member.held),
                                                     "busy" if leases else "idle", None)}
    command = ("HSET", keys.worker(member.worker_id), *itertools.chain.from_iterable(fields.items()))
    replies = scripts.pipelined([calls.heartbeat(member.worker_id, leases)], [command])
    calls.heartbeat(member.worker_id, leases).parse(replies[0])


def idle_lanes(scripts: Scripts, calls: Calls, fleet: list[Member]) -> int:
    """Each lane claims once on the empty pool and, finding nothing, is marked idle."""
    n = 0
    for member in fleet:
        if member.lane:
            if scripts.run(calls.claim(member.request)).task is not None:
                raise RuntimeError(f"lane {member.worker_id} claimed a task on an empty pool")
            n += 1
    return n
