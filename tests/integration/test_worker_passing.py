"""Workers of two apps in one pool (a rolling upgrade): a task one app lacks the handler of is
passed on to the workers that run it (gpuq/worker/passing.py), real processes, real Redis."""

from __future__ import annotations

import pytest
from procs import SCALE, Procs

from gpuq import Queue, State
from gpuq.errors import TaskFailed

pytestmark = pytest.mark.slow


def chaos_worker(procs: Procs, name: str) -> None:
    """A worker of the other app (workers.chaos: handler chaos.run, which the sim app lacks)."""
    proc = procs.start(name, ["worker", "--app", "workers.chaos:app", "--vram-gb", "80",
                              "--gpu-name", "sim-80GB", "--name", name])
    procs.wait_registered(proc)


def test_a_task_only_another_app_runs_is_passed_on_not_failed(procs: Procs, real_queue: Queue) -> None:
    chaos_worker(procs, "new")
    busy = real_queue.enqueue("chaos.run", {"s": 2.0}, model="m-small", vram_gb=4, priority="P1")
    procs.wait_running_on(busy.id, "new")
    old = procs.worker("old")  # idle while "new" is busy: it is the one offered the next task
    procs.wait_idle("old")
    task = real_queue.enqueue("chaos.run", {"s": 0.05}, model="m-mid", vram_gb=10, priority="P1")
    record = procs.wait_state(task.id, State.SUCCEEDED, timeout=20)
    assert record.worker == "new" and record.attempt == 1  # the passes used no attempt
    assert "task.passed task=" + task.id in old.log()
    assert "task.failed" not in old.log()


def test_a_handler_no_live_worker_runs_still_fails(procs: Procs, real_queue: Queue) -> None:
    procs.worker("old")
    task = real_queue.enqueue("chaos.run", {"s": 0.05}, model="m-mid", vram_gb=10)
    with pytest.raises(TaskFailed, match="not registered"):
        task.result(timeout=15)


def test_a_model_one_worker_cannot_load_runs_on_another_without_spending_attempts(
        procs: Procs, real_queue: Queue) -> None:
    """Regression: a worker whose loader of a model raised took that model's next tasks too
    and failed each one's load, spending their attempts while another worker could load it."""
    procs.worker("good")
    busy = real_queue.enqueue("sim.run", model="m-busy", vram_gb=4, est_s=2.0 / SCALE, priority="P2")
    procs.wait_running_on(busy.id, "good")
    broken = procs.worker("broken", env={"GPUQ_SIM_LOAD_FAILS": "m-x"})
    procs.wait_idle("broken")  # idle while "good" is busy: it takes the first m-x task
    tasks = [real_queue.enqueue("sim.run", model="m-x", vram_gb=4, est_s=0.05 / SCALE,
                                priority="P2", max_attempts=1) for _ in range(6)]
    for task in tasks:
        record = procs.wait_state(task.id, State.SUCCEEDED, timeout=30)
        assert record.worker == "good" and record.attempt == 1
    log = broken.log()
    assert log.count("model.load_failed worker=broken model=m-x") == 1  # then it skipped m-x
    assert "task.passed task=" in log and "task.failed" not in log


def test_a_skipped_models_task_is_claimed_when_the_backoff_ends_not_at_the_next_wake_up(
        procs: Procs, real_queue: Queue) -> None:
    """Regression: an idle worker skipping a model blocked for its whole idle_block_s (60 s
    here) past the backoff's end (2 s): a task of that model queued meanwhile waited for an
    unrelated wake-up. Two slots: woken by enqueue rather than handed the task."""
    broken = procs.worker("broken", concurrency=2, env={
        "GPUQ_SIM_LOAD_FAILS": "m-x", "GPUQ_LOAD_BACKOFF_S": "2", "GPUQ_IDLE_BLOCK_S": "60"})
    first = real_queue.enqueue("sim.run", model="m-x", vram_gb=4, max_attempts=1)
    procs.wait_state(first.id, State.FAILED, timeout=15)  # its load failed: m-x skipped for 2 s
    task = real_queue.enqueue("sim.run", model="m-x", vram_gb=4, max_attempts=1)
    record = procs.wait_state(task.id, State.FAILED, timeout=20)  # claimed, its load tried again
    assert "loading model m-x failed" in (record.error or "")
    assert broken.log().count("model.load_failed worker=broken model=m-x") == 2
    assert "failures=2" in broken.log()
