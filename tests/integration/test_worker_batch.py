"""A real worker process runs batch handlers (tests/batch_app.py) against real Redis."""

from __future__ import annotations

import re

import pytest
from procs import Procs

from gpuq import Queue, State

pytestmark = pytest.mark.slow
BATCH_APP = "tests.batch_app:app"


def start_worker(procs: Procs, name: str) -> None:
    proc = procs.start(name, ["worker", "--app", BATCH_APP, "--vram-gb", "80", "--gpu-name", "sim-80GB",
                              "--name", name])
    procs.wait_registered(proc)


def test_a_batch_handler_runs_ten_tasks_each_with_its_own_result(procs: Procs, real_queue: Queue) -> None:
    tasks = real_queue.enqueue_many([{"handler": "batch.echo", "payload": {"n": i}, "model": "bge",
                                      "vram_gb": 4, "priority": "P1"} for i in range(10)])
    start_worker(procs, "w1")
    records = procs.wait_all([t.id for t in tasks], State.SUCCEEDED)
    sizes = []
    for i, (task, r) in enumerate(zip(tasks, records)):
        assert r.result["echo"] == {"n": i} and r.result["task"] == task.id
        assert (r.attempt, r.result["attempt"], r.worker, r.error) == (1, 1, "w1", None)
        sizes.append(r.result["batch"])
    assert max(sizes) == 4 and sum(1 / s for s in sizes) == pytest.approx(3)  # 4, 4 and 2
    tokens = [procs.redis.hget(real_queue.keys.task(t.id), "token") for t in tasks]
    assert len(set(tokens)) == 10


def test_a_wrong_count_fails_every_task_of_the_batch_with_the_reason(procs: Procs,
                                                                     real_queue: Queue) -> None:
    tasks = real_queue.enqueue_many([{"handler": "batch.short", "payload": i, "model": "bge",
                                      "vram_gb": 4, "max_attempts": 1} for i in range(3)])
    start_worker(procs, "w1")
    records = procs.wait_all([t.id for t in tasks], State.FAILED)
    errors = {r.error for r in records}
    assert len(errors) == 1
    (error,) = errors
    assert re.fullmatch(r"batch handler 'batch.short' returned 2 results for 3 tasks", error), error
    assert procs.status()["stats"]["failed"] == 3
