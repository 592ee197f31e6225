"""Run times a worker measures and sends (gpuq.worker.runtimes.RunTimes): the bounded buffer,
the executor adding acked runs only, the heartbeat's sends, and gpuq.testing.drain's."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import fakeredis
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gpuq import Config, Queue, State, worker_record
from gpuq.app import App, Context
from gpuq.scripts import LEARN_MAX_RUNS
from gpuq.testing import drain
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.loop import Worker
from gpuq.worker.runtimes import CAPACITY, RunTimes, learnable

GPU = GpuInfo("L4", "uuid", 24, None, "declared")


def runs(n: int, start: int = 0) -> list[tuple[str, str, float]]:
    return [("h", "m", float(i)) for i in range(start, start + n)]


def test_runs_come_out_oldest_first_at_most_limit_each_take() -> None:
    buf = RunTimes()
    for run in runs(5):
        assert buf.add(*run)
    assert buf.take(2) == runs(2) and len(buf) == 3
    assert buf.take(10) == runs(3, 2) and buf.take(10) == [] and len(buf) == 0
    assert buf.take() == [] and RunTimes().capacity == CAPACITY == 4 * LEARN_MAX_RUNS


@pytest.mark.parametrize("run", [
    ("", "m", 1.0), ("h", "", 1.0), ("h x", "m", 1.0), ("h", "m\t", 1.0), ("h\n", "m", 1.0),
    ("h", "m\r", 1.0), ("h\v", "m", 1.0), ("h", "m\f", 1.0), ("h", "m", -0.001),
    ("h", "m", float("nan")), ("h", "m", float("inf")), ("h", "m", 1e11),
])
def test_a_run_learn_would_refuse_is_not_kept(run: tuple[str, str, float]) -> None:
    """One such run would make learn.lua refuse the whole call."""
    buf = RunTimes()
    assert not learnable(*run) and not buf.add(*run) and len(buf) == 0
    assert buf.add("h.é", "m/1:2", 0.0) and buf.add("h", "m", 1e10)  # no whitespace: fine


def test_put_back_goes_in_front_in_order() -> None:
    buf = RunTimes()
    for run in runs(6):
        buf.add(*run)
    taken = buf.take(4)
    buf.add("h", "m", 99.0)
    buf.put_back(taken)
    assert buf.take(10) == [*runs(6), ("h", "m", 99.0)]


def test_past_the_capacity_the_oldest_go_and_are_counted() -> None:
    buf = RunTimes(capacity=4)
    for run in runs(6):
        buf.add(*run)
    assert buf.dropped() == 2 and buf.dropped() == 0
    assert buf.take(2) == runs(2, 2)
    buf.add("h", "m", 6.0)
    buf.put_back(runs(2, 100))  # a failed call's runs are the oldest: they go first
    assert buf.dropped() == 1
    assert buf.take(10) == [("h", "m", 101.0), *runs(3, 4)]
    with pytest.raises(ValueError):
        RunTimes(capacity=0)


def test_adds_from_many_threads_are_all_kept() -> None:
    buf = RunTimes(capacity=100_000)

    def add(k: int) -> None:
        for i in range(2_000):
            buf.add(f"h{k}", "m", float(i))

    threads = [threading.Thread(target=add, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    taken = buf.take(100_000)
    assert len(taken) == 16_000 and buf.dropped() == 0
    for k in range(8):  # each thread's runs in its order
        assert [x for h, _, x in taken if h == f"h{k}"] == [float(i) for i in range(2_000)]


def learned(q: Queue) -> dict[str, str]:
    return q.redis.hgetall(q.keys.runtimes)


def test_send_makes_one_call_per_256_runs_and_puts_back_on_a_failure() -> None:
    q = Queue(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"))
    buf = RunTimes()
    for run in runs(600):
        buf.add(*run)
    assert buf.send(q.scripts, q.calls) == LEARN_MAX_RUNS and len(buf) == 600 - 256
    assert learned(q)["h m"].endswith(" 256")
    assert buf.send(q.scripts, q.calls, rounds=None) == 600 - 256 and len(buf) == 0
    assert learned(q)["h m"].endswith(" 600")
    assert buf.send(q.scripts, q.calls, rounds=None) == 0

    dead = Queue(redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0),
                             decode_responses=True),
                 Config(pool="p"))
    for run in runs(3):
        buf.add(*run)
    with pytest.raises(redis.ConnectionError):
        buf.send(dead.scripts, dead.calls)
    assert buf.take(10) == runs(3)


def started_worker(client: redis.Redis, app: App) -> Worker:
    worker = Worker(client, Config(pool="p").validate(), app, GPU, worker_id="w")
    worker.presence.register(worker_record.identity("w", GPU, 5, 1, "0123", "h", 1), 30_000)
    return worker


def timing_app(load_s: float, run_s: float) -> App:
    app = App("runtimes-test")

    @app.any_model()
    def load(name: str) -> str:
        time.sleep(load_s)
        return name

    @app.handler("slow")
    def slow(model: Any, payload: Any, ctx: Context) -> str:
        time.sleep(run_s)
        if payload == "boom":
            raise ValueError("boom")
        return "ok"

    return app


def run_one(worker: Worker, q: Queue, payload: Any, *, cancel: bool = False) -> None:
    """Claim, run and settle one task as a runner does; ``cancel`` ends it before its ack."""
    task = q.enqueue("slow", payload, model="m", vram_gb=1)
    got = worker.claim(None)
    assert isinstance(got, tuple)
    claimed = got[0]
    assert claimed[0]["id"] == task.id
    call = worker.executor.execute(*claimed)
    assert call is not None
    if cancel:
        q.cancel(task.id)
    worker.executor.settle(call, worker.scripts.run_raw(call))


def test_only_a_run_whose_ack_succeeded_is_added_with_its_handler_time() -> None:
    """From the handler's start, once its model is loaded, to its return: the load (0.3 s
    here) is not counted, nor a failed run, nor one whose ack came back stale."""
    client = fakeredis.FakeRedis(decode_responses=True)
    q = Queue(client, Config(pool="p"))
    worker = started_worker(client, timing_app(load_s=0.3, run_s=0.05))
    run_one(worker, q, "ok")
    ((handler, model, seconds),) = worker.runtimes.take()
    assert (handler, model) == ("slow", "m") and 0.05 <= seconds < 0.25
    run_one(worker, q, "boom")  # failed: retried later, nothing learned
    run_one(worker, q, "ok", cancel=True)  # canceled while it ran: its ack is stale
    assert len(worker.runtimes) == 0 and worker.executor.unacked == {}
    assert not client.exists(q.keys.runtimes)  # ack writes none


def test_the_heartbeat_sends_the_runs_after_its_beat_and_when_it_stops(
        caplog: pytest.LogCaptureFixture) -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    q = Queue(client, Config(pool="p"))
    worker = started_worker(client, timing_app(load_s=0, run_s=0))
    heartbeat = worker.heartbeat()
    run_one(worker, q, "ok")
    assert not client.exists(q.keys.runtimes)
    heartbeat.flush()
    assert learned(q)["slow m"].endswith(" 1") and len(worker.runtimes) == 0
    for _ in range(LEARN_MAX_RUNS + 10):
        worker.runtimes.add("slow", "m", 0.5)
    heartbeat.flush()  # a beat sends one call
    assert learned(q)["slow m"].endswith(" 257") and len(worker.runtimes) == 10
    heartbeat.stop()  # not started: stopping sends the rest
    assert learned(q)["slow m"].endswith(" 267") and len(worker.runtimes) == 0
    # more runs a beat than the buffer keeps while the calls succeed: the newest are learned,
    # and that is no warning (a busy batch worker does it every beat)
    for x in range(CAPACITY + 5):
        worker.runtimes.add("slow", "m", float(x))
    with caplog.at_level(logging.DEBUG, logger="gpuq.worker.heartbeat"):
        heartbeat.flush()
    (busy,) = [r for r in caplog.records if "runtimes.dropped" in r.getMessage()]
    assert busy.levelname == "DEBUG" and "runs=5" in busy.getMessage()
    assert len(worker.runtimes) == CAPACITY - LEARN_MAX_RUNS
    worker.runtimes.take(CAPACITY)
    caplog.clear()

    def gone(call: object) -> None:
        raise redis.ConnectionError("Connection refused.")

    worker.scripts.run = gone  # type: ignore[method-assign,assignment]
    worker.runtimes.capacity = 4
    for x in range(3):
        worker.runtimes.add("slow", "m", float(x))
    with caplog.at_level(logging.DEBUG, logger="gpuq.worker.heartbeat"):
        heartbeat.flush()
        heartbeat.flush()
        for x in range(3):
            worker.runtimes.add("slow", "m", float(x))
        heartbeat.flush()
    records = [r for r in caplog.records if r.name == "gpuq.worker.heartbeat"]
    said = [(r.levelname, r.getMessage().split()[0]) for r in records]
    assert said == [("WARNING", "runtimes.unsent"), ("DEBUG", "runtimes.unsent"),
                    ("DEBUG", "runtimes.unsent"), ("WARNING", "runtimes.dropped")]
    assert "runs=2" in records[-1].getMessage()
    assert worker.runtimes.take() == [("slow", "m", 2.0), ("slow", "m", 0.0), ("slow", "m", 1.0),
                                      ("slow", "m", 2.0)]


def test_drain_sends_the_run_times_so_a_later_task_gets_the_learned_mean() -> None:
    app = timing_app(load_s=0, run_s=0.02)
    q = Queue(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"))
    tasks = [q.enqueue("slow", "ok", model="m", vram_gb=1) for _ in range(3)]
    q.enqueue("slow", "boom", model="m", vram_gb=1, max_attempts=1)
    assert drain(q, app, vram_gb=24) == 4
    assert all(t.status() is State.SUCCEEDED for t in tasks)
    mean, _, n = learned(q)["slow m"].split()
    assert n == "3" and 0.02 <= float(mean) < 0.5
    later = q.enqueue("slow", "ok", model="m", vram_gb=1)
    assert later.record().est_from == "history" and later.record().est_s == float(mean)


def test_a_batch_s_runs_are_added_as_each_would_be() -> None:
    buf = RunTimes(capacity=4)
    shared = ("h", "m", 2)
    buf.add_all([shared, shared, ("h x", "m", 1.0), ("h", "m", float("nan")), ("g", "m", 1.5), shared])
    assert buf.take() == [("h", "m", 2.0), ("h", "m", 2.0), ("g", "m", 1.5), ("h", "m", 2.0)]
    assert all(type(r[2]) is float for r in buf.take())
    buf.add_all(runs(6))
    assert buf.take() == runs(4, 2) and buf.dropped() == 2
