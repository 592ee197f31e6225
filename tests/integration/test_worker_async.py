"""A real worker process runs ``async def`` handlers (workers/engine.py) with --concurrency > 1.

The engine app's model holds 16 GB of weights; its tasks declare 18 GB, so each runs with
2 GB of working memory. Times are scaled down by the suite (GPUQ_SIM_TIME_SCALE=0.1): a
load takes 0.1 s, an engine step about 2 ms.
"""

from __future__ import annotations

import pytest
from procs import Proc, Procs, wait_for

from gpuq import Queue, State

pytestmark = pytest.mark.slow
ENGINE_APP = "workers.engine:app"
MODEL, NEED, WEIGHTS = "sim-llm", 18.0, 16.0


def start_worker(procs: Procs, name: str, concurrency: int,
                 env: dict[str, str] | None = None) -> Proc:
    proc = procs.start(name, ["worker", "--app", ENGINE_APP, "--vram-gb", "80", "--gpu-name",
                              "sim-80GB", "--name", name, "--concurrency", str(concurrency)], env)
    procs.wait_registered(proc)
    return proc


def enqueue(q: Queue, handler: str, payload: object = None, **options: object) -> str:
    return q.enqueue(handler, payload, model=MODEL, vram_gb=NEED, **options).id  # type: ignore[arg-type]


def free_gb(procs: Procs, worker: str) -> float:
    return float(procs.redis.hget(procs.keys.worker(worker), "vram_free_gb") or "nan")


def test_async_tasks_run_at_once_on_one_engine_whose_weights_count_once(
        procs: Procs, real_queue: Queue) -> None:
    worker = start_worker(procs, "w1", concurrency=4)
    ids = [enqueue(real_queue, "engine.generate", {"tokens": 400}) for _ in range(4)]
    info = enqueue(real_queue, "engine.info", priority="P3")  # a blocking handler, same app
    usable = 80 - 5
    # while the four run, the worker's hash (heartbeat) and `gpuq status` show the weights
    # once and the working memory of each task
    running = usable - WEIGHTS - 4 * (NEED - WEIGHTS)
    wait_for(lambda: free_gb(procs, "w1") == running, 15,
             message=lambda: f"free VRAM {running} (it is {free_gb(procs, 'w1')}); log:\n{worker.log()}")
    (shown,) = procs.status()["workers"]
    assert shown["vram_free_gb"] == running and shown["models"] == [MODEL]
    records = procs.wait_all(ids, State.SUCCEEDED)
    # overlapping run windows: each started before any ended
    assert max(r.started_at for r in records) < min(r.finished_at for r in records)
    assert {r.result["engine"] for r in records} == {records[0].result["engine"]}
    assert {r.result["loads"] for r in records} == {1}  # the loader ran once
    assert max(r.result["widest_step"] for r in records) >= 2  # requests shared engine steps
    assert all(r.attempt == 1 and r.result["tokens"] == 400 for r in records)
    got = procs.wait_state(info, State.SUCCEEDED).result
    assert got["engine"] == records[0].result["engine"] and got["thread"].startswith("runner-")
    assert worker.log().count("model.loaded") == 1
    wait_for(lambda: free_gb(procs, "w1") == usable - WEIGHTS, 5, message="the ledger to settle")


def test_a_yield_request_reaches_an_async_handler_and_keeps_its_attempt(
        procs: Procs, real_queue: Queue) -> None:
    worker = start_worker(procs, "w1", concurrency=2)
    task = enqueue(real_queue, "engine.generate", {"tokens": 1500, "log": True})  # about 3 s
    wait_for(lambda: f"engine.generating task={task} from=0" in worker.log(), 10,
             message=lambda: f"the handler to start; log:\n{worker.log()}")
    procs.redis.lpush(procs.keys.control("w1"), f"yield {task} 10000")
    # it saves the tokens done and gives way; the worker takes it back and it resumes there
    record = procs.wait_state(task, State.SUCCEEDED, timeout=30)
    assert f"preempt.yielded task={task}" in worker.log()
    assert record.preemptions == 1 and record.attempt == 1  # the yield used no attempt
    assert 0 < record.result["resumed_from"] < 1500 and record.result["tokens"] == 1500
    assert "preempt.stopped" not in worker.log()


def test_an_async_handler_ignoring_a_stop_is_cancelled_at_the_deadline_and_requeued(
        procs: Procs, real_queue: Queue) -> None:
    worker = start_worker(procs, "w1", concurrency=2)
    task = enqueue(real_queue, "engine.stubborn", {"seconds": 60})
    wait_for(lambda: f"engine.stubborn task={task} first=True" in worker.log(), 10,
             message=lambda: f"the handler to start; log:\n{worker.log()}")
    # as preempt.lua asks: the stop past the grace requeues only a task still asked to yield
    procs.redis.hset(procs.keys.task(task), mapping={"yield_by": "1", "yield_for": "p0"})
    procs.redis.lpush(procs.keys.control("w1"), f"yield {task} 300")
    # cancelled inside (CancelledError at its await), requeued, then run again (at once:
    # the handler is stubborn only the first time)
    record = procs.wait_state(task, State.SUCCEEDED, timeout=20)
    log = worker.log()
    assert f"preempt.stopped task={task}" in log and f"engine.cancelled task={task}" in log
    assert record.result["first"] is False and record.preemptions == 1
    assert record.attempt == 1  # the stop gave the attempt back
    assert worker.alive() and "worker.stuck" not in log


def test_a_raising_async_handler_is_retried(procs: Procs, real_queue: Queue) -> None:
    start_worker(procs, "w1", concurrency=3)
    task = enqueue(real_queue, "engine.flaky", max_attempts=3)
    record = procs.wait_state(task, State.SUCCEEDED, timeout=20)
    assert record.attempt == 2 and record.result["attempt"] == 2


def test_a_burst_reaches_every_runner_of_a_worker_with_many_slots(procs: Procs,
                                                                  real_queue: Queue) -> None:
    """Enqueue wakes a worker once and the pool's list holds 16 wake-ups at most: the runner
    that claims wakes a blocked sibling, which claims and wakes the next, so all 24 tasks run
    together rather than some an idle timeout (30 s here) later."""
    start_worker(procs, "w1", concurrency=24, env={"GPUQ_IDLE_BLOCK_S": "30"})
    warm = enqueue(real_queue, "engine.generate", {"tokens": 1})
    procs.wait_state(warm, State.SUCCEEDED)
    procs.wait_idle("w1")
    tasks = real_queue.enqueue_many([{"handler": "engine.generate", "payload": {"tokens": 800},
                                      "model": MODEL, "vram_gb": NEED} for _ in range(24)])
    records = procs.wait_all([t.id for t in tasks], State.SUCCEEDED, timeout=25)
    assert max(r.started_at for r in records) < min(r.finished_at for r in records)
