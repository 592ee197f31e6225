"""gpuq.backoff: delays double to a cap, and an outage is said once, however many loops retry."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gpuq import Config, backoff
from gpuq.app import App
from gpuq.embedded import free_port
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.loop import Worker


def test_delays_double_up_to_the_cap_and_reset() -> None:
    b = backoff.Backoff(first=0.1, cap=1.0)
    delays = [b.delay() for _ in range(7)]
    bounds = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert all(0.8 * hi <= d <= hi for d, hi in zip(delays, bounds))
    b.reset()
    assert b.delay() <= 0.1


def test_an_outage_is_said_once_by_many_loops(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    outage = backoff.Outage("worker=w1", logging.getLogger("t"))
    error = redis.ConnectionError("Connection refused")
    threads = [threading.Thread(target=lambda: [outage.down(error) for _ in range(50)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outage.up(time.monotonic())
    outage.up(time.monotonic())
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "redis.unavailable worker=w1 error=Connection refused: retrying with backoff up to 5 s",
        lines[1]]
    assert lines[1].startswith("redis.recovered worker=w1 after ")
    outage.down(error)  # a second outage is said again
    assert len(caplog.records) == 3 and outage.outages == 2


def test_a_reply_to_a_call_sent_before_the_outage_is_no_recovery(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    outage = backoff.Outage("reaper=abc", logging.getLogger("t"))
    sent = time.monotonic()
    outage.down(redis.ConnectionError("Connection closed by server."))
    outage.up(sent)  # began before the server went away: says nothing about it being back
    assert outage.since is not None
    assert [r.getMessage().split()[0] for r in caplog.records] == ["redis.unavailable"]


def test_a_workers_runner_and_heartbeat_share_its_outage(caplog: pytest.LogCaptureFixture) -> None:
    """Both loops of a worker fail on a server that is gone: the worker's one Outage says so
    once, not once per loop."""
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2, decode_responses=True,
                       retry=Retry(NoBackoff(), 0))  # each call fails at once
    worker = Worker(dead, Config(pool="p").validate(), App("a"),
                    GpuInfo("L4", "uuid", 24, None, "declared"), worker_id="w1")
    heartbeat = worker.heartbeat()
    runner = threading.Thread(target=worker.runner, daemon=True)
    with caplog.at_level(logging.WARNING):
        heartbeat.start()
        runner.start()
        time.sleep(0.6)  # both loops fail, back off and fail again meanwhile
        worker.stopping.set()
        heartbeat.stop()
        runner.join(2)
    said = [r for r in caplog.records if r.getMessage().startswith("redis.unavailable")]
    assert len(said) == 1 and "worker=w1" in said[0].getMessage()
    assert worker.outage.outages == 1 and not runner.is_alive()
