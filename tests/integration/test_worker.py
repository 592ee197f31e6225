"""Real worker processes (``python -m gpuq worker --app workers.sim:app``) against real Redis.

Simulated GPUs are declared with ``--vram-gb``; the sim app's load and run times are scaled
down (tests/procs.py), so every scenario runs in a few seconds.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import SCALE, Procs, est, wait_for

from gpuq import Queue, State, catalog
from gpuq.errors import TaskFailed

pytestmark = pytest.mark.slow



def test_end_to_end_enqueue_to_result(procs: Procs, real_queue: Queue) -> None:
    procs.worker("w1")
    task = real_queue.enqueue("sim.run", {"prompt": "hi"}, model="m-e2e", vram_gb=10,
                              priority="online", est_s=est(0.05))
    result = task.result(timeout=15)
    assert result["worker"] == "w1"
    assert result["model"] == "m-e2e"
    assert result["attempt"] == 1
    record = task.record()
    assert record.state is State.SUCCEEDED
    assert record.attempt == 1 and record.worker == "w1"
    assert record.error is None
    assert record.enqueued_at <= record.started_at <= record.finished_at
    # the worker shows the model it now holds
    status = procs.status()
    (worker,) = status["workers"]
    assert worker["id"] == "w1" and worker["models"] == ["m-e2e"] and worker["alive"]
    assert status["stats"]["succeeded"] == 1


def test_a_task_handed_to_an_idle_worker_runs_there_past_its_pickup_deadline(
        procs: Procs, real_queue: Queue) -> None:
    """An idle one-slot worker is handed the task at enqueue (no claim) and pops it off its
    wake list: the task keeps its full lease (2 s in this suite) past the pickup deadline
    (P0: 100 ms), and the reaper's and other claims' look at `handed` leaves it there."""
    procs.worker("w1")
    procs.reaper()
    # a reaper still starting on a slow host would leave `handed` as it is
    wait_for(lambda: real_queue.redis.get(real_queue.keys.reaper_lock), message="the reaper's lead")
    procs.wait_idle("w1")
    task = real_queue.enqueue("sim.run", model="m-hand", vram_gb=10, priority="online",
                              est_s=est(2.0))
    r = real_queue.record(task.id)  # started by the enqueue itself
    assert r.state is State.RUNNING and r.worker == "w1" and r.attempt == 1
    procs.wait_state(task.id, State.RUNNING)  # popped off its wake list: picked up
    lease = real_queue.redis.zscore(real_queue.keys.running, task.id)
    assert lease is not None and lease - procs.server_ms() > 1_000
    # past the pickup deadline (100 ms) a reaper round (every 0.2 s here) takes it out of
    # `handed`, the task left running (it runs 2 s)
    wait_for(lambda: real_queue.redis.zscore(real_queue.keys.handed, task.id) is None, timeout=1.5,
             message="the task out of handed")
    r = real_queue.record(task.id)
    assert (r.state, r.worker, r.attempt) == (State.RUNNING, "w1", 1)
    assert task.result(timeout=15)["worker"] == "w1"
    assert real_queue.record(task.id).attempt == 1


def test_cli_enqueue_wait_prints_the_result(procs: Procs) -> None:
    procs.worker("w1")
    out = procs.cli("enqueue", "sim.noop", "--payload", '{"echo": [1, 2]}', "--model", "m-cli",
                    "--vram-gb", "4", "--priority", "online", "--wait", "--timeout", "15")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"echo": [1, 2]}
    failed = procs.cli("enqueue", "sim.fail", "--payload", '{"message": "bad prompt"}',
                       "--model", "m-cli", "--vram-gb", "4", "--max-attempts", "1", "--wait",
                       "--timeout", "15")
    assert failed.returncode == 3 and failed.stdout == ""  # the task ended not done
    (line,) = failed.stderr.strip().splitlines()
    assert re.fullmatch(r"Error: task [0-9a-f]{32} failed: RuntimeError: bad prompt", line), line


def test_held_model_is_preferred_over_older_task(procs: Procs, real_queue: Queue) -> None:
    procs.worker("w1")
    first = real_queue.enqueue("sim.run", model="model-a", vram_gb=20, est_s=est(1.0))
    procs.wait_state(first.id, State.RUNNING)  # the worker loaded A and is busy
    older_b = real_queue.enqueue("sim.run", model="model-b", vram_gb=20, est_s=est(0.05))
    newer_a = real_queue.enqueue("sim.run", model="model-a", vram_gb=20, est_s=est(0.05))
    assert first.status() is State.RUNNING, "the first task ended before the others were queued"
    a1, b, a2 = procs.wait_all([first.id, older_b.id, newer_a.id], State.SUCCEEDED)
    assert a2.started_at < b.started_at
    assert a1.finished_at <= a2.started_at
    assert a2.result["model"] == "model-a" and b.result["model"] == "model-b"
    loads = {e.name: e.loads for e in catalog.read(procs.redis, real_queue.keys)}
    assert loads == {"model-a": 1, "model-b": 1}  # A's second task ran warm


def test_big_task_waits_for_a_gpu_that_fits(procs: Procs, real_queue: Queue) -> None:
    procs.worker("small", vram_gb=24, gpu_name="L4")
    big = real_queue.enqueue("sim.run", model="llama-big", vram_gb=40, est_s=est(0.05))
    small = real_queue.enqueue("sim.run", model="tiny", vram_gb=4, est_s=est(0.05))
    # the 24 GB worker ran the task enqueued after the big one, and passed the big one over
    assert small.result(timeout=15)["worker"] == "small"
    assert big.status() is State.QUEUED

    status = procs.status()
    assert status["unschedulable"] == 1
    assert status["unschedulable_ids"] == [big.id]
    assert status["largest_gpu_gb"] == pytest.approx(19.0)  # 24 GB minus the KV reserve
    assert [(q["priority"], q["model"], q["depth"]) for q in status["queues"]] == [("P2", "llama-big", 1)]
    text = procs.run_cli("status")
    assert "unschedulable" in text and big.id in text
    assert big.status() is State.QUEUED

    procs.worker("large", vram_gb=80, gpu_name="H100")
    assert big.result(timeout=15)["worker"] == "large"
    assert procs.status()["unschedulable"] == 0


def test_p0_behind_a_thousand_p3_starts_on_the_next_free_slot(procs: Procs,
                                                               real_queue: Queue) -> None:
    procs.worker("w1")
    busy = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(1.5))
    procs.wait_state(busy.id, State.RUNNING)
    backlog = real_queue.enqueue_many(
        {"handler": "sim.noop", "payload": i, "model": "m", "vram_gb": 10, "priority": "P3"}
        for i in range(1000))
    urgent = real_queue.enqueue("sim.noop", "urgent", model="m", vram_gb=10, priority="P0")
    assert busy.status() is State.RUNNING, "the slot freed before the P0 task was queued"

    urgent_rec = procs.wait_state(urgent.id, State.SUCCEEDED)
    busy_rec = busy.record()
    assert busy_rec.finished_at <= urgent_rec.started_at
    assert urgent_rec.started_at - busy_rec.finished_at < 1.0
    started = [r.started_at for r in procs.records([t.id for t in backlog]) if r.started_at]
    assert all(s >= urgent_rec.started_at for s in started)


def test_failures_retry_with_backoff_then_fail(procs: Procs, real_queue: Queue) -> None:
    procs.worker("w1")
    task = real_queue.enqueue("sim.fail", {"message": "out of memory 42"}, model="m",
                              vram_gb=8, max_attempts=3)
    delayed = procs.wait_state(task.id, State.DELAYED)
    assert delayed.attempt == 1 and delayed.error == "RuntimeError: out of memory 42"
    assert procs.redis.zscore(real_queue.keys.delayed, task.id) is not None
    with pytest.raises(TaskFailed) as info:
        task.result(timeout=20)
    assert info.value.state == "failed"
    assert "out of memory 42" in info.value.error
    record = task.record()
    assert record.state is State.FAILED and record.attempt == 3
    assert record.error == "RuntimeError: out of memory 42"
    # backoff 0.2 s then 0.4 s (GPUQ_RETRY_BASE_S=0.2) between the three attempts
    assert record.finished_at - record.enqueued_at >= 0.6
    assert procs.redis.zscore(real_queue.keys.delayed, task.id) is None


def test_a_task_for_an_unregistered_handler_leaves_the_gpu_whole(procs: Procs, real_queue: Queue) -> None:
    """Regression: the model cache reserved the task's model (evicting idle ones) before the
    handler was looked up, and the failure path left a placeholder that never loaded: one
    producer's typo cut the GPU's free VRAM until the worker restarted, and the evicted
    models stayed listed as held."""
    procs.worker("w1", vram_gb=24, gpu_name="L4")  # 19 GB usable
    typo = real_queue.enqueue("nope.x", model="bge-m3", vram_gb=4)
    with pytest.raises(TaskFailed, match="not registered"):
        typo.result(timeout=15)

    def free_gb() -> float:
        return float(procs.redis.hget(real_queue.keys.worker("w1"), "vram_free_gb") or -1)

    wait_for(lambda: free_gb() == 19, 5, message=lambda: f"free VRAM back to 19 (is {free_gb()})")
    big = real_queue.enqueue("sim.run", model="llama3-8b", vram_gb=16, est_s=est(0.05))
    assert big.result(timeout=15)["model"] == "llama3-8b"
    # with llama3-8b held (3 GB free), a typo for another model must not evict it
    typo = real_queue.enqueue("nope.x", model="bge-m3", vram_gb=4)
    with pytest.raises(TaskFailed, match="not registered"):
        typo.result(timeout=15)
    again = real_queue.enqueue("sim.run", model="llama3-8b", vram_gb=16, est_s=est(0.05))
    assert again.result(timeout=15)["model"] == "llama3-8b"
    wait_for(lambda: free_gb() == 3, 5, message=lambda: f"free VRAM 3 (is {free_gb()})")
    assert procs.redis.smembers(real_queue.keys.holders("llama3-8b")) == {"w1"}
    assert procs.redis.hget(real_queue.keys.worker("w1"), "models") == "llama3-8b"
    assert procs.procs[0].log().count("model.loaded") == 1  # the second run found it warm


def test_concurrency_two_runs_two_tasks_at_once(procs: Procs, real_queue: Queue) -> None:
    procs.worker("w1", concurrency=2)
    tasks = [real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(0.8))
             for _ in range(2)]
    a, b = procs.wait_all([t.id for t in tasks], State.SUCCEEDED)
    assert a.worker == b.worker == "w1"
    assert a.started_at < b.finished_at and b.started_at < a.finished_at


def test_burst_exits_when_nothing_runnable_is_left(procs: Procs, real_queue: Queue) -> None:
    runnable = [real_queue.enqueue("sim.noop", i, model="m", vram_gb=4) for i in range(3)]
    too_big = real_queue.enqueue("sim.noop", model="m-big", vram_gb=40)
    worker = procs.worker("burst", vram_gb=24, burst=True, wait=False)
    assert worker.wait(20) == 0, worker.log()
    assert [r.state for r in procs.records([t.id for t in runnable])] == [State.SUCCEEDED] * 3
    assert too_big.status() is State.QUEUED
    assert not procs.registered("burst")  # it left the pool cleanly


def test_sigterm_with_long_grace_finishes_the_task(procs: Procs, real_queue: Queue) -> None:
    """The running task's result is written before the worker leaves the pool. (Three
    rounds: a result sent after the worker stopped waiting would be lost in a race.) The
    signal goes once the handler started (`began_at`): a task popped off the wake list but
    not yet begun when the stop comes is given back, by design."""
    for round_ in range(3):
        name = f"w{round_}"
        worker = procs.worker(name, env={"GPUQ_SHUTDOWN_GRACE_S": "10"})
        task = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(0.5))
        procs.wait_state(task.id, State.RUNNING)
        key = real_queue.keys.task(task.id)
        wait_for(lambda k=key: real_queue.redis.hget(k, "began_at"), 15,
                 message=f"the handler of {task.id} to start")
        worker.terminate()
        assert worker.wait(15) == 0, worker.log()
        record = task.record()
        assert (record.state, record.attempt) == (State.SUCCEEDED, 1), f"round {round_}: {record}"
        assert record.result["worker"] == name
        assert not procs.registered(name)


def test_sigterm_with_short_grace_requeues_then_another_worker_completes(
        procs: Procs, real_queue: Queue) -> None:
    worker = procs.worker("w1", env={"GPUQ_SHUTDOWN_GRACE_S": "0.2"})
    task = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(1.5))
    procs.wait_state(task.id, State.RUNNING)
    worker.terminate()
    assert worker.wait(15) == 0, worker.log()
    record = task.record()
    assert record.state is State.QUEUED
    assert record.attempt == 0  # the attempt was given back
    assert record.worker is None and record.token is None
    assert record.error == "worker shut down"
    assert not procs.registered("w1")

    procs.worker("w2")
    finished = procs.wait_state(task.id, State.SUCCEEDED, timeout=20)
    assert finished.attempt == 1 and finished.result["worker"] == "w2"


def test_sigterm_asks_a_running_handler_to_yield_and_the_next_run_resumes(
        procs: Procs, real_queue: Queue) -> None:
    """A handler that checkpoints when asked to yield keeps its progress across a SIGTERM:
    1 s (GPUQ_GRACE_S) before the 3 s grace ends the worker asks it to yield, it goes back
    with its checkpoint (no preemption counted), the worker exits before the grace is out,
    and the next worker's run resumes where it stopped."""
    worker = procs.worker("w1", env={"GPUQ_SHUTDOWN_GRACE_S": "3", "GPUQ_GRACE_S": "1"})
    task = real_queue.enqueue("sim.run", {"run_s": est(6)}, model="m", vram_gb=10)
    wait_for(lambda: real_queue.redis.hget(real_queue.keys.task(task.id), "began_at"), 15,
             message="the handler to start")
    worker.terminate()
    assert worker.wait(15) == 0, worker.log()
    record = task.record()
    assert (record.state, record.attempt, record.preemptions, record.error) == (
        State.QUEUED, 0, 0, "worker shut down")
    assert record.checkpoint["done_s"] > 0, record
    assert "worker.yield_asked worker=w1 tasks=1" in worker.log()
    said = f"task.requeued task={task.id} worker=w1 reason=yielded_at_shutdown checkpoint=saved"
    assert said in worker.log()
    assert "reason=shutdown" not in worker.log()  # not given back at the grace's end
    procs.worker("w2")
    finished = procs.wait_state(task.id, State.SUCCEEDED, timeout=20)
    assert finished.attempt == 1 and finished.result["resumed_from_s"] == record.checkpoint["done_s"]


def test_a_second_sigint_gives_running_tasks_back_at_once(procs: Procs, real_queue: Queue) -> None:
    """Ctrl-C twice: the second ends the grace (30 s here) and the task goes back, attempt
    given back, as when the grace runs out."""
    worker = procs.worker("w1", env={"GPUQ_SHUTDOWN_GRACE_S": "30"})
    task = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(60))
    procs.wait_state(task.id, State.RUNNING)
    wait_for(lambda: real_queue.redis.hget(real_queue.keys.task(task.id), "began_at"), 15,
             message="the handler to start")
    worker.signal(signal.SIGINT)
    wait_for(lambda: "worker.stopping" in worker.log(), 10, message="the first stop")
    started = time.monotonic()
    worker.signal(signal.SIGINT)
    assert worker.wait(15) == 0, worker.log()
    assert time.monotonic() - started < 10
    record = task.record()
    assert (record.state, record.attempt, record.error) == (State.QUEUED, 0, "worker shut down")
    assert "a second signal" in worker.log() and not procs.registered("w1")


def test_catalog_records_model_load_time(procs: Procs, real_queue: Queue) -> None:
    procs.worker("w1")
    task = real_queue.enqueue("sim.noop", model="bge-m3", vram_gb=3)  # LOAD_S 2.0 s x SCALE
    task.result(timeout=15)
    (entry,) = catalog.read(procs.redis, real_queue.keys)
    assert entry.name == "bge-m3" and entry.loads == 1 and entry.vram_gb == 3
    assert 2.0 * SCALE <= entry.last_load_s < 2.0 * SCALE + 1.0
    assert entry.mean_load_s == pytest.approx(entry.last_load_s)
    (model,) = procs.status()["models"]
    assert model["name"] == "bge-m3" and model["loads"] == 1
    key = real_queue.keys.catalog_model("bge-m3")  # each beat of its holder renews the entry
    procs.redis.pexpire(key, 60_000)
    wait_for(lambda: procs.redis.pttl(key) > 60_000, 15, 0.1, "a heartbeat to renew the entry")


def test_worker_with_unknown_app_exits_with_a_clear_error(procs: Procs) -> None:
    out = procs.cli("worker", "--app", "workers.nope:app", "--vram-gb", "24")
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1].startswith("Error: cannot import app module")
    assert "Traceback" not in out.stderr


def test_the_gpuq_script_finds_an_app_module_in_the_current_directory(
        procs: Procs, real_queue: Queue, tmp_path: Path) -> None:
    """A new user's `gpuq worker --app myapp:app` next to myapp.py (the console script's
    sys.path starts at its bin directory, not the current one)."""
    (tmp_path / "gpuq_readme_app.py").write_text(
        "from gpuq import App\napp = App('mine')\n\n\n@app.any_model()\ndef load(name):\n"
        "    return name\n\n\n@app.handler('echo')\ndef echo(model, payload, ctx):\n"
        "    return payload\n")
    task = real_queue.enqueue("echo", {"x": 1}, model="m", vram_gb=4)
    script = Path(sys.executable).parent / "gpuq"
    out = subprocess.run([str(script), "--redis", procs.url, "--pool", procs.pool, "worker", "--app",
                          "gpuq_readme_app:app", "--vram-gb", "24", "--gpu-name", "L4", "--burst"],
                         env=procs.environment(), cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert task.result(timeout=5) == {"x": 1}


def test_unknown_handler_fails_without_retry(procs: Procs, real_queue: Queue) -> None:
    procs.worker("w1")
    task = real_queue.enqueue("sim.nope", model="m", vram_gb=4, max_attempts=3)
    record = procs.wait_state(task.id, State.FAILED)
    assert record.attempt == 1  # an app that lacks the handler will not gain it on retry
    assert "handler 'sim.nope' is not registered" in (record.error or "")


def test_idle_worker_wakes_without_polling(procs: Procs, real_queue: Queue) -> None:
    """An idle worker blocks on its wake list; an enqueue starts the task well under the
    worker's idle block time (GPUQ_IDLE_BLOCK_S is set to 5 s here)."""
    procs.worker("w1", env={"GPUQ_IDLE_BLOCK_S": "5"})
    warm = real_queue.enqueue("sim.noop", model="m", vram_gb=4)
    warm.result(timeout=15)
    procs.wait_idle("w1")
    task = real_queue.enqueue("sim.noop", model="m", vram_gb=4, priority="online")
    record = procs.wait_state(task.id, State.SUCCEEDED, timeout=10)
    assert record.started_at - record.enqueued_at < 2.5


def test_sigkill_is_not_needed_for_shutdown(procs: Procs) -> None:
    """SIGINT stops an idle worker as SIGTERM does: exit 0, nothing left in the pool."""
    worker = procs.worker("w1")
    worker.signal(signal.SIGINT)
    assert worker.wait(10) == 0, worker.log()
    assert not procs.registered("w1")
    assert procs.redis.exists(procs.keys.worker("w1")) == 0


def test_cancel_of_a_running_task_stops_its_handler(procs: Procs, real_queue: Queue) -> None:
    worker = procs.worker("w1")
    long = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(20.0))
    procs.wait_state(long.id, State.RUNNING)
    out = procs.cli("cancel", long.id)
    assert out.returncode == 0 and out.stdout.strip() == f"canceled {long.id} (was running)"
    # the worker sees the lost lease at its next heartbeat, stops the handler, and is free
    follow = real_queue.enqueue("sim.noop", "next", model="m", vram_gb=10)
    record = procs.wait_state(follow.id, State.SUCCEEDED, timeout=10)
    assert record.worker == "w1"
    assert record.finished_at - long.record().finished_at < 3.0
    canceled = long.record()
    assert canceled.state is State.CANCELED and canceled.result is None
    wait_for(lambda: "lease.lost" in worker.log(), message="the worker to log the lost lease")


def test_a_canceled_handler_that_runs_on_is_stopped_past_the_grace(procs: Procs,
                                                                  real_queue: Queue) -> None:
    """Found by a QA pass: a handler that does not check ctx.should_stop() ran its whole
    run after a cancel while its worker, its task set empty, took nothing. Past the grace
    (1 s here) the worker stops it in-process and takes the next task."""
    worker = procs.worker("w1", env={"GPUQ_GRACE_S": "1"})
    long = real_queue.enqueue("sim.run", {"ignore_yield": True}, model="m", vram_gb=10,
                              est_s=est(60.0))
    wait_for(lambda: procs.redis.hget(procs.keys.task(long.id), "began_at"), 10,
             message="its handler to start, its model loaded")
    real_queue.cancel(long.id)
    follow = real_queue.enqueue("sim.noop", "next", model="m", vram_gb=10)
    record = procs.wait_state(follow.id, State.SUCCEEDED, timeout=15)
    assert record.worker == "w1" and worker.alive()
    assert record.finished_at - long.record().finished_at < 6.0  # a beat and the grace, not 60 s
    wait_for(lambda: f"task.stopped task={long.id}" in worker.log(), 5, message="the stop logged")
    assert long.record().state is State.CANCELED


def test_a_task_canceled_while_its_model_loads_never_runs_and_the_worker_stays(
        procs: Procs, real_queue: Queue) -> None:
    """A cancel during a load longer than the grace and the stop time together (5.5 s
    against 0.5 + 1): the task's handler never starts, and the load is not taken for a stuck
    handler (the worker does not exit); the next task of the model starts warm."""
    worker = procs.worker("w1", vram_gb=80, env={"GPUQ_GRACE_S": "0.5", "GPUQ_STOP_S": "1"})
    long = real_queue.enqueue("sim.run", model="llama3-70b", vram_gb=70, est_s=est(1))
    procs.wait_state(long.id, State.RUNNING)
    real_queue.cancel(long.id)
    follow = real_queue.enqueue("sim.run", {}, model="llama3-70b", vram_gb=70, est_s=est(0.05))
    record = procs.wait_state(follow.id, State.SUCCEEDED, timeout=20)
    assert record.worker == "w1" and worker.alive()
    assert "worker.stuck" not in worker.log() and long.record().state is State.CANCELED


def test_small_gpu_evicts_its_idle_model_for_the_next_one(procs: Procs, real_queue: Queue) -> None:
    procs.worker("w1", vram_gb=24)  # 19 GB usable
    keys = real_queue.keys

    def models() -> list[str]:
        (worker,) = procs.status()["workers"]
        return list(worker["models"])

    real_queue.enqueue("sim.noop", model="m-a", vram_gb=12).result(timeout=15)
    assert models() == ["m-a"]
    real_queue.enqueue("sim.noop", model="m-b", vram_gb=12).result(timeout=15)
    assert models() == ["m-b"]  # 12 + 12 > 19: A was evicted
    assert procs.redis.smembers(keys.holders("m-a")) == set()
    assert procs.redis.smembers(keys.holders("m-b")) == {"w1"}
    real_queue.enqueue("sim.noop", model="m-c", vram_gb=5).result(timeout=15)
    assert models() == ["m-b", "m-c"]  # 12 + 5 fits: both stay
    loads = {e.name: e.loads for e in catalog.read(procs.redis, keys)}
    assert loads == {"m-a": 1, "m-b": 1, "m-c": 1}


def test_a_held_models_bigger_task_evicts_the_other_idle_model_and_stays_warm(
        procs: Procs, real_queue: Queue) -> None:
    procs.worker("w1", vram_gb=24)  # 19 GB usable
    keys = real_queue.keys
    real_queue.enqueue("sim.noop", model="m-a", vram_gb=8).result(timeout=15)
    real_queue.enqueue("sim.noop", model="m-b", vram_gb=8).result(timeout=15)
    (worker,) = procs.status()["workers"]
    assert sorted(worker["models"]) == ["m-a", "m-b"]  # 3 GB left free
    # 14 GB on m-a: 6 GB beyond its weights, which only m-b's room makes
    task = real_queue.enqueue("sim.noop", model="m-a", vram_gb=14)
    assert procs.wait_state(task.id, State.SUCCEEDED, timeout=15).worker == "w1"
    (worker,) = procs.status()["workers"]
    assert worker["models"] == ["m-a"]
    assert procs.redis.smembers(keys.holders("m-b")) == set()
    assert procs.redis.smembers(keys.holders("m-a")) == {"w1"}
    loads = {e.name: e.loads for e in catalog.read(procs.redis, keys)}
    assert loads == {"m-a": 1, "m-b": 1}  # m-a stayed loaded: no second load


def test_best_fit_sends_a_small_task_to_the_small_gpu(procs: Procs, real_queue: Queue) -> None:
    procs.worker("big", vram_gb=80, gpu_name="H100")
    procs.worker("small", vram_gb=24, gpu_name="L4")
    for name in ("big", "small"):
        procs.wait_idle(name)
    small_task = real_queue.enqueue("sim.noop", model="m-small", vram_gb=10)
    assert procs.wait_state(small_task.id, State.SUCCEEDED).worker == "small"
    large_task = real_queue.enqueue("sim.noop", model="m-large", vram_gb=30)
    assert procs.wait_state(large_task.id, State.SUCCEEDED).worker == "big"


def test_concurrent_slots_never_overcommit_vram(procs: Procs, real_queue: Queue) -> None:
    """Two slots on a 24 GB GPU (19 usable): two 12 GB models cannot be resident together,
    so their tasks run one after the other; two 8 GB ones run side by side."""
    procs.worker("w1", vram_gb=24, concurrency=2)
    a, b = (real_queue.enqueue("sim.run", model=m, vram_gb=12, est_s=est(0.5))
            for m in ("m-a", "m-b"))
    ra, rb = procs.wait_all([a.id, b.id], State.SUCCEEDED)
    first, second = sorted((ra, rb), key=lambda r: r.started_at or 0)
    assert second.started_at >= first.finished_at

    c, d = (real_queue.enqueue("sim.run", model=m, vram_gb=8, est_s=est(0.5))
            for m in ("m-c", "m-d"))
    rc, rd = procs.wait_all([c.id, d.id], State.SUCCEEDED)
    assert rc.started_at < rd.finished_at and rd.started_at < rc.finished_at


def test_long_load_and_run_outlive_the_lease(procs: Procs, real_queue: Queue) -> None:
    """Heartbeats renew the lease out of band: a 3 s model load and a 1.5 s run under a 2 s
    lease, with a reaper watching, complete in one attempt."""
    procs.reaper()
    procs.worker("w1", env={"GPUQ_SIM_TIME_SCALE": "0.75"})
    task = real_queue.enqueue("sim.run", model="whisper-large", vram_gb=6, est_s=2.0)
    record = procs.wait_state(task.id, State.SUCCEEDED, timeout=20)
    assert record.attempt == 1 and record.result["worker"] == "w1"
    (entry,) = catalog.read(procs.redis, real_queue.keys)
    assert entry.last_load_s >= 3.0


def test_a_task_yielded_during_its_model_load_counts_its_sla_once(procs: Procs,
                                                                   real_queue: Queue) -> None:
    """Asked to yield while its model loads, the task gives way before its handler starts
    (the attempt given back), so no SLA is decided; its next start, warm, decides it once."""
    procs.worker("w1")
    procs.wait_idle("w1")
    task = real_queue.enqueue("sim.run", model="llama3-8b", vram_gb=16, priority="P0",
                              est_s=est(0.02))  # its load: 1.2 s here
    procs.wait_state(task.id, State.RUNNING)  # picked up: loading
    time.sleep(0.05)
    procs.redis.lpush(procs.keys.control("w1"), f"yield {task.id} 30000")
    record = procs.wait_state(task.id, State.SUCCEEDED)
    assert record.attempt == 1 and record.preemptions == 1
    stats = procs.redis.hgetall(procs.keys.stats)
    assert stats["preempt:yielded"] == "1"
    assert stats["sla_missed:P0"] == "1" and "sla_met:P0" not in stats
    (miss,) = procs.redis.lrange(procs.keys.sla_misses, 0, -1)
    assert json.loads(miss)["kind"] == "late"  # decided by its second, warm claim
