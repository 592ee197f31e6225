"""A runner's duty as its shape's lookout (lib/lookout.lua): what it tells its claims, on fakeredis."""

from __future__ import annotations

from typing import Any

import fakeredis

from gpuq import Config
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.loop import Worker
from workers.sim import app


def worker() -> Worker:
    client = fakeredis.FakeRedis(decode_responses=True)
    return Worker(client, Config(pool="lk").validate(), app, GpuInfo("sim", "x", 80, None, "declared"),
                  worker_id="w")


def test_a_look_token_wakes_the_worker_as_its_shapes_lookout() -> None:
    w = worker()
    w.redis.lpush(w.keys.wake("w"), "look")
    assert w.wait_for_work(0.0) is True
    w.redis.lpush(w.keys.wake("w"), "1")
    assert w.wait_for_work(0.0) is None


def test_a_runner_claims_as_the_lookout_after_a_retry_or_a_look_token() -> None:
    w = worker()
    replies: list[float] = [1.5, 0.0, 0.0, 0.0]  # a retry, then nothing to look again for
    wakes: list[Any] = [None, True, None]  # timed out; a "look" token; a plain wake-up
    sent: list[bool] = []

    def claim(pending: object = None, lookout: bool = False) -> float:
        sent.append(lookout)
        if len(sent) == len(replies):
            w.stopping.set()
        return replies[len(sent) - 1]

    w.claim = claim  # type: ignore[assignment,method-assign]
    w.wait_for_work = lambda retry_s: wakes.pop(0)  # type: ignore[method-assign]
    w.runner()
    # after the retry: the lookout; after a claim with nothing to look for: not, until the
    # "look" token; then not again
    assert sent == [False, True, True, False]
