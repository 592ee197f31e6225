"""What a runner tells its claims, on fakeredis: its duty as its shape's lookout (lib/lookout.lua), and
whether it is in `idle`."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

from gpuq import Config
from gpuq.worker import loop
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


def run(w: Worker, replies: list[Any], wakes: list[Any]) -> list[tuple[bool, bool]]:
    """Run ``w``'s runner on scripted claim replies and wake-ups; what each claim was told:
    (lookout, unlisted)."""
    sent: list[tuple[bool, bool]] = []

    def claim(pending: object = None, lookout: bool = False, unlisted: bool = False) -> Any:
        sent.append((lookout, unlisted))
        if len(sent) == len(replies):
            w.stopping.set()
        return replies[len(sent) - 1]

    w.claim = claim  # type: ignore[assignment,method-assign]
    w.wait_for_work = lambda retry_s: wakes.pop(0)  # type: ignore[method-assign]
    w.runner()
    return sent


def test_a_runner_claims_as_the_lookout_after_a_retry_or_a_look_token() -> None:
    # a retry, then nothing to look again for; timed out, a "look" token, a plain wake-up
    sent = run(worker(), [1.5, 0.0, 0.0, 0.0], [None, True, None])
    # after the retry: the lookout; after a claim with nothing to look for: not, until the
    # "look" token; then not again
    assert [lookout for lookout, _ in sent] == [False, True, True, False]


def test_a_one_slot_runner_given_a_task_tells_its_next_claim_it_is_not_idle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Only its own claim that finds nothing puts a one-slot worker in `idle`; a claim or a
    hand-over that gives it a task leaves it out, so the claim after need not take it out."""
    task = (({"id": "t", "priority": "2"}, None, None), None)
    monkeypatch.setattr(loop.batch, "execute", lambda *args, **kw: [])
    sent = run(worker(), [task, task, 0.0, 0.0, 0.0], [None, (({"id": "h", "priority": "2"}), None, None)])
    # unknown at first; after each task taken: unlisted; after nothing: listed; after a
    # hand-over (which took it out of `idle`): unlisted
    assert [unlisted for _, unlisted in sent] == [False, True, True, False, True]
