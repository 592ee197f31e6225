"""Task lifecycles per second: the fleet's claimers split over a few OS processes.

Each process drives its share of the claiming workers ("virtual workers") in turns: one round
trip in which each worker sends what a one-slot ``gpuq worker`` sends (the ack of the task it
holds with its next claim, one ``ack_claim`` call, the claim telling the script it is not in
`idle`; its first claim alone), then one with a new task enqueued per ack for the acked
task's model, so each model's queue keeps its size. A lifecycle is one enqueue, one claim and
one ack; the tasks in hand at the deadline are acked alone then. The processes start together
on a barrier and stop at a deadline; the caller reads the server's CPU and INFO commandstats
around the whole run.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.synchronize import Barrier, Event
from typing import Any

from bench.scale_fleet import HANDLER, TASK_GB
from gpuq.config import Config
from gpuq.connection import connect
from gpuq.keys import Keys
from gpuq.scripts import Call, Calls, Claim, ClaimRequest, Scripts
from gpuq.task import TaskSpec


@dataclass(frozen=True)
class Share:
    """What one process drives."""

    url: str
    pool: str
    lease_s: float
    requests: tuple[ClaimRequest, ...]
    seconds: float


def new_task(model: str) -> TaskSpec:
    return TaskSpec.build(HANDLER, None, model=model, vram_gb=TASK_GB)


class Workers:
    """Simulated one-slot workers sending what ``gpuq worker`` sends, and the task each holds."""

    def __init__(self, scripts: Scripts, calls: Calls, requests: tuple[ClaimRequest, ...]) -> None:
        self.scripts, self.calls, self.requests = scripts, calls, requests
        self.unlisted = [replace(r, unlisted=True) for r in requests]
        self.held: list[dict[str, str] | None] = [None] * len(requests)

    def turn(self) -> tuple[int, int]:
        """Each worker's ack with its next claim in one round trip, then a new task for each
        acked one's model in another; the lifecycles ended and the claims that found nothing."""
        calls, sent = self.calls, []
        for i, task in enumerate(self.held):  # as gpuq.worker: the ack rides with the next claim
            if task is not None:
                sent.append(calls.ack(task["id"], int(task["token"]), "null"))
            sent.append(calls.claim(self.requests[i] if task is None else self.unlisted[i]))
        replies = iter(zip(sent, self.scripts.pipelined(sent)))
        refill: list[Call[Any]] = []
        empty = 0
        for i, task in enumerate(self.held):
            if task is not None:
                call, reply = next(replies)
                call.parse(reply)
                refill.append(calls.enqueue([new_task(task["model"])]))
            call, reply = next(replies)
            self.held[i] = Claim.parse(reply).task
            empty += self.held[i] is None
        if refill:
            for call, reply in zip(refill, self.scripts.pipelined(refill)):
                call.parse(reply)
        return len(refill), empty

    def stop(self) -> int:
        """The tasks in hand end as a stopping worker's do: acked alone (each ack and enqueue
        alternate, so no two workers' acks are joined into one call); how many."""
        last = [c for t in self.held if t is not None
                for c in (self.calls.ack(t["id"], int(t["token"]), "null"),
                          self.calls.enqueue([new_task(t["model"])]))]
        for call, reply in zip(last, self.scripts.pipelined(last) if last else []):
            call.parse(reply)
        self.held = [None] * len(self.requests)
        return len(last) // 2


def drive(share: Share, ready: Barrier, go: Event, results: Any) -> None:
    """The process body: turns until the deadline, then the tasks in hand acked, so every
    claim of the window is one lifecycle and the later phases find no task running."""
    config = Config(pool=share.pool, lease_s=share.lease_s)
    client = connect(share.url)
    client.ping()  # connected; the scripts are loaded on the server already
    workers = Workers(Scripts(client, Keys(share.pool, config.prefix)), Calls(config), share.requests)
    done = empty = turns = 0
    ready.wait()
    go.wait()
    t0 = time.perf_counter()
    deadline = t0 + share.seconds
    while time.perf_counter() < deadline:
        ended, none = workers.turn()
        done, empty, turns = done + ended, empty + none, turns + 1
    done += workers.stop()
    results.put({"lifecycles": done, "empty_claims": empty, "turns": turns,
                 "seconds": time.perf_counter() - t0})
    client.close()


Hook = Callable[[], None]


def run(url: str, pool: str, lease_s: float, requests: list[ClaimRequest], procs: int,
        seconds: float, before: Hook, after: Hook) -> tuple[list[dict[str, Any]], float]:
    """Drive the requests (dealt round-robin) from ``procs`` processes for ``seconds``; their
    results and the wall seconds from the start to the last one's end. ``before()`` runs
    once every process is connected, just before they start; ``after()`` once all ended."""
    ctx = mp.get_context("spawn")
    procs = max(1, min(procs, len(requests)))
    ready, go, results = ctx.Barrier(procs + 1), ctx.Event(), ctx.Queue()
    shares = [Share(url, pool, lease_s, tuple(requests[i::procs]), seconds)
              for i in range(procs)]
    children = [ctx.Process(target=drive, args=(s, ready, go, results), daemon=True) for s in shares]
    for c in children:
        c.start()
    try:
        ready.wait(timeout=120)
        before()
        go.set()
        t0 = time.perf_counter()
        out = [results.get(timeout=seconds + 120) for _ in children]
        wall = time.perf_counter() - t0
        after()
    finally:
        for c in children:
            c.join(30)
            if c.is_alive():
                c.kill()
    bad = [c.exitcode for c in children if c.exitcode != 0]
    if bad:
        raise RuntimeError(f"lifecycle processes exited with {bad}")
    return out, wall
