"""A handler's ``timeout_s``: a call still running past it fails its task and is stopped as
a lost run is (gpuq.worker.control.Control.time_out), on fakeredis."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import fakeredis
import pytest

from gpuq import Config, Queue, State, worker_record
from gpuq.app import App, BatchContext, Context
from gpuq.errors import StopTask
from gpuq.scripts import Call
from gpuq.worker.control import Control
from gpuq.worker.executor import Claimed
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.loop import Worker
from gpuq.worker.running import Running

ERROR = "ran past its 30 s timeout"


def make_app(seen: list[str]) -> App:
    app = App("timeouts")

    @app.any_model()
    def load(name: str) -> str:
        return name

    @app.handler("slow", timeout_s=30)
    def slow(model: str, payload: Any, ctx: Context) -> str:
        return "done"

    @app.handler("spin", timeout_s=0.2)
    def spin(model: str, payload: Any, ctx: Context) -> str:
        """Runs on past its bound, never checking should_stop()."""
        try:
            while True:
                if ctx.should_stop() and "should_stop" not in seen:
                    seen.append("should_stop")
                time.sleep(0.01)
        except StopTask:
            seen.append("StopTask")
            raise

    @app.handler("await", timeout_s=0.2)
    async def wait(model: str, payload: Any, ctx: Context) -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("CancelledError")
            raise
        return "done"

    @app.handler("pair", batch=2, timeout_s=30)
    def pair(model: str, payloads: list[Any], ctx: BatchContext) -> list[Any]:
        return payloads
    return app


def worker_on(app: App, concurrency: int = 1) -> tuple[Queue, Worker, Control]:
    client = fakeredis.FakeRedis(decode_responses=True)
    config = Config(pool="to", concurrency=concurrency, grace_s=0.05, stop_s=5).validate()
    worker = Worker(client, config, app, GpuInfo("sim", "x", 80, None, "declared"), worker_id="w")
    worker.presence.register(worker_record.identity("w", worker.gpu, 5, concurrency, "0123", "h", 1),
                             30_000)
    return Queue(client, config), worker, worker.heartbeat().control


def claim(worker: Worker) -> Claimed:
    got = worker.claim(None)
    assert isinstance(got, tuple)
    return got[0]


def in_handler_past_its_bound(running: Running) -> None:
    """As Executor.invoke leaves a run whose bound passed: in its handler, its deadline gone."""
    running.run_deadline, running.timeout_s = 0.0, 30.0
    running.in_handler = True


def test_a_call_past_its_timeout_fails_its_task_and_is_stopped_as_a_lost_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The task fails at the bound, retryable, with one line; the handler sees should_stop()
    at once, StopTask past the grace, and one that still runs past stop_s makes the worker
    exit with its stuck code (the machinery a lost run goes through)."""
    queue, worker, control = worker_on(make_app([]))
    task = queue.enqueue("slow", 1, model="m", vram_gb=1, max_attempts=2)
    _, _, running = claim(worker)
    interrupted: list[str] = []
    monkeypatch.setattr(Running, "interrupt", lambda r: interrupted.append(r.task_id) or True)
    in_handler_past_its_bound(running)
    control.watch()
    record = queue.record(task.id)
    assert (record.state, record.error) == (State.DELAYED, ERROR)  # retried after its backoff
    assert running.stopped and running.stopped_as == "retried" and running.ctx.should_stop()
    assert running.lost_deadline is not None and interrupted == []  # the grace first
    running.lost_deadline = 0.0
    control.watch()
    assert interrupted == [task.id] and running.stop_deadline is not None
    stuck: list[str] = []
    monkeypatch.setattr(control, "exit_stuck", lambda r: stuck.append(r.task_id))
    running.stop_deadline = 0.0
    control.watch()
    assert stuck == [task.id]


def test_the_last_attempt_past_its_timeout_ends_failed() -> None:
    queue, worker, control = worker_on(make_app([]))
    task = queue.enqueue("slow", 1, model="m", vram_gb=1, max_attempts=1)
    _, _, running = claim(worker)
    in_handler_past_its_bound(running)
    control.watch()
    record = queue.record(task.id)
    assert (record.state, record.error, running.stopped_as) == (State.FAILED, ERROR, "failed")


def test_a_call_within_its_bound_runs_on_and_the_watch_wakes_for_its_bound() -> None:
    queue, worker, control = worker_on(make_app([]))
    task = queue.enqueue("slow", 1, model="m", vram_gb=1)
    _, _, running = claim(worker)
    in_handler_past_its_bound(running)
    running.run_deadline = time.monotonic() + 30
    assert 0 < control.watch() <= 30
    assert queue.record(task.id).state is State.RUNNING and not running.ctx.should_stop()
    running.in_handler = False  # out of its handler (its ack on the way): no bound any more
    running.run_deadline = 0.0
    control.watch()
    assert queue.record(task.id).state is State.RUNNING and not running.stopped


def test_the_watch_looks_again_within_the_shortest_bound_of_the_app() -> None:
    """A call starting while the heartbeat waits is looked at within its bound, not up to a
    heartbeat period (5 s) later, which would let a 0.2 s bound run 25 times over."""
    _, _, control = worker_on(make_app([]))
    assert control.watch() <= 0.2
    _, _, plain = worker_on(App("none"))
    assert plain.watch() == float("inf")


def test_a_task_canceled_before_its_bound_is_not_failed_by_it() -> None:
    """The fail is fenced: a run whose lease went first keeps its task's end (canceled)."""
    queue, worker, control = worker_on(make_app([]))
    task = queue.enqueue("slow", 1, model="m", vram_gb=1)
    _, _, running = claim(worker)
    task.cancel()
    in_handler_past_its_bound(running)
    control.watch()
    assert queue.record(task.id).state is State.CANCELED
    assert running.run_deadline is None and not running.stopped  # left to the lost-lease path


def test_a_batch_past_its_timeout_fails_each_task_in_one_round_trip_and_is_stopped_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound covers the batch's one call: every task of it fails, one pipeline of fails,
    and its thread gets one StopTask (a second could land in the worker's own code)."""
    queue, worker, control = worker_on(make_app([]), concurrency=2)
    tasks = [queue.enqueue("slow", i, model="m", vram_gb=1) for i in range(2)]
    runs = [claim(worker)[2], claim(worker)[2]]  # one runner thread: as a batch's runs
    assert runs[0].thread_id == runs[1].thread_id
    for r in runs:
        in_handler_past_its_bound(r)
    sent: list[int] = []
    pipelined = worker.scripts.pipelined

    def counted(calls: list[Call[Any]], *args: Any) -> list[Any]:
        sent.append(len(calls))
        return pipelined(calls, *args)
    monkeypatch.setattr(worker.scripts, "pipelined", counted)
    interrupted: list[str] = []
    monkeypatch.setattr(Running, "interrupt", lambda r: interrupted.append(r.task_id) or True)
    control.watch()
    assert sent == [2]
    assert [queue.record(t.id).error for t in tasks] == [ERROR, ERROR]
    for r in runs:
        r.lost_deadline = 0.0
    control.watch()
    assert len(interrupted) == 1 and all(r.stop_deadline is not None for r in runs)


def test_a_batch_handler_s_call_carries_its_bound() -> None:
    queue, worker, _ = worker_on(make_app([]))
    spec = worker.app.handlers["pair"]
    ctx = Context("t", 1, "w", "m", 1.0, 1.0)
    runs = [Running(f"t{i}", 1, ctx, 0.0) for i in range(2)]
    seen: list[tuple[float | None, float]] = []

    def fn(model: Any, payloads: list[Any], bctx: BatchContext) -> list[Any]:
        seen.extend((r.run_deadline, r.timeout_s) for r in runs)
        return payloads
    before = time.monotonic()
    worker.executor.invoke(type(spec)(spec.name, fn, None, 2, 0.0, False, spec.timeout_s), runs,
                           "m", [1, 2], BatchContext([ctx, ctx]))
    assert len(seen) == 2 and all(t == 30.0 and d is not None and d >= before + 30 for d, t in seen)


def run_to_its_end(worker: Worker, control: Control) -> list[Any]:
    """Claim and execute a task in a runner thread (a run's thread is its claimer's) while
    this thread plays the heartbeat's part (control.watch), until the runner's execute
    returns."""
    ended: list[Any] = []
    runner = threading.Thread(target=lambda: ended.append(worker.executor.execute(*claim(worker))))
    runner.start()
    while runner.is_alive():
        control.watch()
        runner.join(0.02)
    return ended


@pytest.mark.parametrize("handler, stopped_by", [("spin", ["should_stop", "StopTask"]),
                                                 ("await", ["CancelledError"])])
def test_a_handler_that_runs_on_past_its_bound_is_stopped_and_its_task_failed(
        handler: str, stopped_by: list[str]) -> None:
    """A real handler call, blocking or async, on past its 0.2 s bound, not checking
    should_stop(): StopTask in its thread (an async one: its asyncio task cancelled) past
    the grace; its task failed with the bound, the worker's slot free, nothing sent by the
    runner (the fail was the worker's)."""
    seen: list[str] = []
    queue, worker, control = worker_on(make_app(seen))
    task = queue.enqueue(handler, 1, model="m", vram_gb=1, max_attempts=1)
    try:
        assert run_to_its_end(worker, control) == [None]
    finally:
        worker.cache.aio.close()
    record = queue.record(task.id)
    assert (record.state, record.error) == (State.FAILED, "ran past its 0.2 s timeout")
    assert seen == stopped_by and worker.running.slots_used() == 0
