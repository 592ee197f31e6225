"""A worker's give-back at shutdown (gpuq.worker.loop.Worker.give_back), on fakeredis."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import fakeredis
import pytest
import redis

from gpuq import Config, Queue, State, worker_record
from gpuq.worker import control as control_module
from gpuq.worker import leaving
from gpuq.worker.control import EXIT_STUCK
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.loop import Worker
from gpuq.worker.running import Running
from workers.sim import app


def claimed(config: Config | None = None, the_app: Any = app, handler: str = "sim.noop",
            vram_gb: float = 1, payload: Any = 1) -> tuple[Queue, Worker, Any]:
    """A worker on fakeredis that claimed the one task enqueued (model m): the queue, the
    worker and what the claim gave it."""
    client = fakeredis.FakeRedis(decode_responses=True)
    config = config or Config(pool="sd").validate()
    queue = Queue(client, config)
    worker = Worker(client, config, the_app, GpuInfo("sim", "x", 80, None, "declared"), worker_id="w")
    worker.presence.register(worker_record.identity("w", worker.gpu, 5, 1, "0123", "h", 1), 30_000)
    queue.enqueue(handler, payload, model="m", vram_gb=vram_gb, max_attempts=1)
    got = worker.claim(None)
    assert isinstance(got, tuple)
    return queue, worker, got[0]


def ran_one(config: Config, the_app: Any = app, handler: str = "sim.noop",
            vram_gb: float = 1) -> tuple[Queue, Worker]:
    """A worker that ran its one task: its model m loaded and idle."""
    queue, worker, claim = claimed(config, the_app, handler, vram_gb)
    worker.settle([call for call in [worker.executor.execute(*claim)] if call])
    assert worker.cache.model_names() == ["m"]
    return queue, worker


def claimed_worker() -> tuple[Queue, Worker, Any]:
    queue, worker, claim = claimed()
    return queue, worker, claim[2]


def test_a_give_back_outlasts_a_short_outage_and_returns_the_attempt() -> None:
    """Tried once, a give-back during an outage left the task to the reaper, which counts
    its attempt (a max_attempts=1 task ended failed without having failed)."""
    queue, worker, running = claimed_worker()
    run, down = worker.scripts.run, [2]

    def flaky(call: Any) -> Any:
        if down[0]:
            down[0] -= 1
            raise redis.ConnectionError("Connection refused")
        return run(call)

    worker.scripts.run = flaky  # type: ignore[method-assign]
    worker.give_back(running.task_id, running.token, until=time.monotonic() + 5)
    record = queue.record(running.task_id)
    assert (record.state.value, record.attempt) == ("queued", 0)


def test_a_give_back_stops_trying_at_its_deadline() -> None:
    queue, worker, running = claimed_worker()

    def down(call: Any) -> Any:
        raise redis.ConnectionError("Connection refused")

    worker.scripts.run = down  # type: ignore[method-assign]
    t0 = time.monotonic()
    worker.give_back(running.task_id, running.token, until=t0 + 0.3)
    assert time.monotonic() - t0 < 1.0
    assert queue.record(running.task_id).state.value == "running"


def test_leaving_outlasts_a_short_outage() -> None:
    """Regression: leave was tried once; a worker that met a brief outage at its exit stayed
    listed live and idle (handed tasks) until its lease ran out."""
    queue, worker, _ = claimed_worker()
    presence, pipeline, down = worker.presence, worker.presence.redis.pipeline, [2]

    def flaky(*args: Any, **kwargs: Any) -> Any:
        pipe = pipeline(*args, **kwargs)
        if down[0]:
            down[0] -= 1
            pipe.execute = lambda: (_ for _ in ()).throw(redis.ConnectionError("refused"))
        return pipe

    presence.redis.pipeline = flaky  # type: ignore[method-assign]
    presence.leave([], until=time.monotonic() + 5)
    assert queue.redis.zscore(queue.keys.workers, "w") is None
    down[0] = 5
    t0 = time.monotonic()
    try:
        presence.leave([], until=t0 + 0.3)
    except redis.ConnectionError:
        pass
    else:
        raise AssertionError("an outage past the deadline raises")
    assert time.monotonic() - t0 < 1.0


def test_a_task_given_back_at_shutdown_keeps_its_saved_checkpoint() -> None:
    """Regression: a SIGTERM's give-back requeued the task without the checkpoint its
    handler had saved: its next run started over (a stop past a yield deadline kept it)."""
    queue, worker, running = claimed_worker()
    running.ctx.save_checkpoint({"done": 30})
    leaving.shutdown(worker, [], worker.heartbeat())
    record = queue.record(running.task_id)
    assert (record.state.value, record.attempt, record.checkpoint) == ("queued", 0, {"done": 30})


def test_a_drain_and_a_sigterm_in_either_order_leave_the_grace_in_force() -> None:
    """The defect (a flaky CI run): a SIGTERM handled just before the drain's own stop was
    taken for the first stop, and the drain then waited for the task without a bound."""
    _, worker, _ = claimed_worker()
    worker.request_stop(15, None)  # SIGTERM first
    worker.drain()  # the drain message read after it
    assert not worker.draining and worker.stopping.is_set()
    _, other, _ = claimed_worker()
    other.drain()
    assert other.draining
    other.request_stop(15, None)  # SIGTERM during the drain: the grace bounds it
    assert not other.draining and not other.hurry.is_set()
    other.request_stop(2, None)  # a second signal: the grace ends
    assert other.hurry.is_set()


def test_an_unloader_that_never_returns_does_not_keep_the_worker_from_exiting() -> None:
    """Regression: the shutdown ran the unloaders on the main thread before leaving: an
    unloader that hung kept the worker from exiting however many signals it got, listed
    live and idle (handed tasks) meanwhile."""
    import threading

    from gpuq import App

    release = threading.Event()
    hanging = App("hang")
    hanging.model("m", vram_gb=4, unload=lambda model: release.wait(30))(lambda name: name)
    hanging.handler("h")(lambda model, payload, ctx: "ok")
    queue, worker = ran_one(Config(pool="sd", stop_s=0.3, shutdown_grace_s=0.3).validate(), hanging,
                            "h", vram_gb=4)
    try:
        t0 = time.monotonic()
        leaving.shutdown(worker, [], worker.heartbeat())
        assert time.monotonic() - t0 < 3.0
        assert queue.redis.zscore(queue.keys.workers, "w") is None
        assert queue.redis.zscore(queue.keys.idle, "w") is None
    finally:
        release.set()


def test_a_retire_whose_last_show_meets_an_outage_still_stops_the_worker() -> None:
    """Regression: an idle worker that retired (left the pool, claiming nothing more) and
    met a Redis error on the write after its unloads never called its stop: it stayed
    running, out of the pool, until killed."""
    _, worker = ran_one(Config(pool="sd", idle_timeout_s=0.01, min_workers=0).validate())

    def down(*args: Any, **kwargs: Any) -> None:
        raise redis.ConnectionError("Connection refused")

    worker.presence.show = down  # type: ignore[method-assign]
    time.sleep(0.05)
    try:
        leaving.check_idle(worker)
    except redis.RedisError:
        pass  # the main loop logs it as an outage and goes on
    assert worker.retired.is_set() and worker.done.is_set()


def test_a_run_given_back_at_shutdown_sends_nothing_when_its_handler_ends() -> None:
    """Regression: the give-back left the run unmarked, so an async handler cancelled by the
    shutdown (or any handler ending after it) had its runner send a fail for a task already
    requeued: "task.failed ... StopTask" and "lease.lost ... failure discarded" logged for
    every task of a graceful stop, and each counted as lost in the worker's metrics."""
    queue, worker, (fields, res, running) = claimed()
    leaving.shutdown(worker, [], worker.heartbeat())
    assert queue.record(running.task_id).state.value == "queued"
    assert running.stopped and running.ctx.should_stop()
    assert worker.executor.execute(fields, res, running) is None


def test_a_stuck_exit_gives_back_the_tasks_still_running_and_logs_each(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A worker exiting stuck gives back its other tasks, attempts returned, as a shutdown
    does, and says so per task (``task.requeued ... reason=stuck``, as a shutdown's give-back
    does): a handler that had started is then no run beyond its claim to whoever reads the
    logs (the chaos soak's checker)."""
    config = Config(pool="sd", concurrency=2).validate()
    queue, worker, (_, _, other) = claimed(config)
    stuck = Running("t-stuck", 1, other.ctx, time.monotonic(), stopped=True)
    exits: list[int] = []
    monkeypatch.setattr(control_module.os, "_exit", exits.append)
    monkeypatch.setattr(control_module.logging, "shutdown", lambda: None)  # caplog reads on
    with caplog.at_level(logging.WARNING, logger="gpuq.worker.control"):
        worker.heartbeat().control.exit_stuck(stuck)
    assert exits == [EXIT_STUCK]
    record = queue.record(other.task_id)
    assert (record.state, record.attempt) == (State.QUEUED, 0)
    assert f"task.requeued task={other.task_id} worker=w reason=stuck" in caplog.text
    assert caplog.text.count("task.requeued") == 1


@pytest.mark.parametrize("heeds", [True, False])
def test_a_shutdown_asks_what_still_runs_to_yield_before_its_grace_ends(heeds: bool) -> None:
    """The defect: a SIGTERM waited out the grace and gave the task back without asking its
    handler to yield, so a handler that checkpoints when asked lost its progress. Now, the
    planner's grace_s (here 0.5 s) before the shutdown grace (2 s) ends, what still runs is
    asked: a handler that yields goes back with its checkpoint, as a give-back (no
    preemption counted); one that ignores it is given back at the grace's end, as before."""
    config = Config(pool="sd", shutdown_grace_s=2, grace_s=0.5).validate()
    queue, worker, claim = claimed(config, handler="sim.run",
                                   payload={"run_s": 30, "ignore_yield": not heeds})
    running = claim[2]

    def runner() -> None:
        call = worker.executor.execute(*claim)
        worker.settle([call] if call else [])

    thread = threading.Thread(target=runner, daemon=True)
    thread.start()
    leaving.shutdown(worker, [thread], worker.heartbeat())
    assert running.leaving and running.ctx.should_yield()
    record = queue.record(running.task_id)
    assert (record.state, record.attempt, record.preemptions, record.error) == (
        State.QUEUED, 0, 0, "worker shut down")
    if heeds:  # yielded once asked (1.5 s in, its model's load included): its checkpoint says so
        assert record.checkpoint["done_s"] > 0 and not thread.is_alive()
    else:
        assert record.checkpoint is None and running.stopped


def test_the_planner_withdrawing_its_yield_leaves_a_shutdown_s_ask_in_force() -> None:
    _, worker, (_, _, running) = claimed()
    control = worker.heartbeat().control
    control.on_yield(running.task_id, 10_000)
    running.leaving = True  # the shutdown asked too
    control.on_unyield(running.task_id)
    assert running.ctx.should_yield()
