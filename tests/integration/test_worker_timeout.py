"""A real worker process runs handlers past their ``timeout_s`` (tests/timeout_app.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from procs import Proc, Procs, wait_for

from gpuq import Config, Queue, State, worker_record
from gpuq.app import App, Context
from gpuq.worker import batch
from gpuq.worker.control import EXIT_STUCK
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.loop import Worker

pytestmark = pytest.mark.slow
TIMEOUT_APP = "tests.timeout_app:app"


def start_worker(procs: Procs, name: str, **env: str) -> Proc:
    proc = procs.start(name, ["worker", "--app", TIMEOUT_APP, "--vram-gb", "80", "--gpu-name",
                              "sim-80GB", "--name", name], env)
    procs.wait_registered(proc)
    return proc


def test_a_handler_sleeping_past_its_timeout_fails_its_task_each_attempt_and_the_worker_goes_on(
        procs: Procs, real_queue: Queue) -> None:
    """The handler sleeps in short steps past its 1 s bound, not checking should_stop():
    each attempt fails with the bound (retried once, then failed), StopTask ends the handler
    past the grace, and the same worker runs the next task."""
    worker = start_worker(procs, "w1", GPUQ_GRACE_S="0.5")
    hung = real_queue.enqueue("slow.sleep", {}, model="m", vram_gb=10, max_attempts=2)
    record = procs.wait_state(hung.id, State.FAILED, timeout=30)
    assert (record.error, record.attempt, record.worker) == ("ran past its 1 s timeout", 2, "w1")
    nxt = real_queue.enqueue("slow.quick", {"n": 1}, model="m", vram_gb=10)
    assert procs.wait_state(nxt.id, State.SUCCEEDED, timeout=15).result == {"n": 1}
    assert worker.alive()
    log = worker.log()
    assert log.count(f"task.timed_out task={hung.id}") == 2
    assert f"task.stopped task={hung.id}" in log and "worker.stuck" not in log


def test_a_busy_handler_that_will_not_stop_makes_the_worker_exit_with_its_stuck_code(
        procs: Procs, real_queue: Queue) -> None:
    """A busy loop that ignores should_stop() and swallows StopTask: past the bound its task
    fails, past the grace and stop_s the worker exits with EXIT_STUCK (its supervisor
    restarts it), having left the pool; the task is not run again by the exit."""
    worker = start_worker(procs, "w1", GPUQ_GRACE_S="0.5", GPUQ_STOP_S="1")
    hung = real_queue.enqueue("slow.spin", {}, model="m", vram_gb=10, max_attempts=1)
    assert worker.wait(timeout=30) == EXIT_STUCK
    assert "worker.stuck" in worker.log()
    record = procs.record(hung.id)
    assert (record.state, record.error) == (State.FAILED, "ran past its 1 s timeout")
    wait_for(lambda: not procs.registered("w1"), 5, message="the stuck worker to have left")


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch"])
def test_a_handler_that_returns_past_its_timeout_unenforced_fails_its_task(queue: Queue,
                                                                          batched: bool) -> None:
    """Regression: control's fail of a call past its bound did not go out (Redis away, the
    worker frozen) and the handler then returned: its ack went out and the task succeeded
    from a call past its timeout_s (a soak's timeout_always task, across a Redis restart).
    Now a call that returns past its bound fails as control would have failed it. Here no
    control runs: the worker is built in-process, and the test plays its runner."""
    app = App("late")
    app.any_model()(lambda name: name)

    if batched:  # regression too: a batch call that returned past its bound was acked
        @app.handler("late", timeout_s=0.05, batch=4)
        def batch_handler(model: Any, payloads: list[Any], ctx: Context) -> list[str]:
            time.sleep(0.2)
            return ["too late"] * len(payloads)
    else:
        @app.handler("late", timeout_s=0.05)
        def handler(model: Any, payload: Any, ctx: Context) -> str:
            time.sleep(0.2)
            return "too late"

    config = Config(pool=queue.config.pool, prefix=queue.config.prefix)
    worker = Worker(queue.redis, config, app, GpuInfo("L4", "u1", 24, None, "declared"), worker_id="w1")
    worker.presence.register(worker_record.identity("w1", worker.gpu, 5.0, 1, "0123", "h", 1, None), 30_000)
    task = queue.enqueue("late", model="m", vram_gb=4, max_attempts=1)
    claimed = worker.claim()
    assert isinstance(claimed, tuple)
    ends = batch.execute(worker.executor, claimed[0])
    assert [c.script for c in ends] == ["fail"]
    worker.settle(ends)
    record = queue.record(task.id)
    assert (record.state, record.error) == (State.FAILED, "ran past its 0.05 s timeout")
