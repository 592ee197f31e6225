"""Who else runs a handler this worker's app lacks (gpuq/worker/passing.py), on fakeredis."""

from __future__ import annotations

import threading
import time

import fakeredis
import pytest

from gpuq.clock import server_ms
from gpuq.keys import Keys
from gpuq.scripts import Call
from gpuq.worker import passing
from gpuq.worker.passing import Elsewhere
from gpuq.worker.presence import Presence


def pool(*workers: tuple[str, str, str, int]) -> Elsewhere:
    """Workers as (id, handlers, levels, ms until their liveness ends from now)."""
    client = fakeredis.FakeRedis(decode_responses=True)
    keys, now = Keys("ps"), server_ms(client)
    for wid, handlers, levels, left_ms in workers:
        client.zadd(keys.workers, {wid: now + left_ms})
        client.hset(keys.worker(wid), mapping={"handlers": handlers, "levels": levels})
    return Elsewhere(Presence(client, keys, "me"))


def test_a_live_worker_of_the_handler_and_level_runs_it() -> None:
    assert pool(("new", "a.x,b.y", "0123", 60_000)).runs("b.y", "2")


@pytest.mark.parametrize("other", [
    ("new", "a.x", "0123", 60_000),     # another handler
    ("new", "b.y", "01", 60_000),       # a lane that does not serve P2
    ("new", "b.y", "0123", -1_000),     # its liveness ended
])
def test_no_live_worker_that_serves_the_task_runs_it(other: tuple[str, str, str, int]) -> None:
    assert not pool(other).runs("b.y", "2")


def test_the_worker_itself_does_not_count() -> None:
    assert not pool(("me", "b.y", "0123", 60_000)).runs("b.y", "2")


def test_an_answer_is_kept_a_while() -> None:
    elsewhere = pool(("new", "b.y", "0123", 60_000))
    assert elsewhere.runs("b.y", "2")
    elsewhere.presence.redis.delete(elsewhere.presence.keys.workers)
    assert elsewhere.runs("b.y", "2")  # within KEEP_S: the pool is not read again
    elsewhere._known.clear()
    assert not elsewhere.runs("b.y", "2")


def test_a_runner_that_passed_a_task_sits_out_the_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(passing, "PASS_S", 0.2)
    stopping = threading.Event()
    ack = Call("ack", ["t1", "3", "0", "null"], str)
    passed = Call("fail", ["t2", "4", "0", "handler", "2", "1000", "0", "0"], str)
    started = time.monotonic()
    assert passing.sit_out([ack], stopping) == [] and time.monotonic() - started < 0.1
    assert not passing.passed([ack]) and passing.passed([ack, passed])
    assert passing.sit_out([ack, passed], stopping) == []
    assert time.monotonic() - started >= 0.2
