"""The running set: its waits woken when a task ends, its slots counted."""

from __future__ import annotations

import threading
import time

from gpuq.app import Context
from gpuq.worker.running import Running, RunningSet


def run(task_id: str, batched: bool = False) -> Running:
    return Running(task_id, 1, Context(task_id, 1, "w", "m", 1.0, 1.0), 0.0, batched=batched)


def test_a_wait_is_woken_when_a_task_ends() -> None:
    """untrack notifies only while a thread waits: the waiter must still hear it."""
    running, r = RunningSet(), run("t1")
    running.track(r)
    waiter = threading.Thread(target=running.wait, args=(60.0,))
    waiter.start()
    while not running._waiting:  # in its wait (the count is taken under the lock)
        time.sleep(0.001)
    ended = time.monotonic()
    running.untrack(r)
    waiter.join(30.0)
    assert not waiter.is_alive() and time.monotonic() - ended < 10 and running._waiting == 0


def test_a_wait_until_is_woken_by_an_end_and_leaves_no_waiter() -> None:
    running, r = RunningSet(), run("t1")
    running.track(r)
    threading.Timer(0.05, running.untrack, [r]).start()
    began = time.monotonic()
    running.wait_until(lambda: len(running) == 0, 60.0)
    assert len(running) == 0 and time.monotonic() - began < 10 and running._waiting == 0


def test_slots_count_a_batch_once_and_none_when_nothing_runs() -> None:
    running = RunningSet()
    assert running.slots_used() == 0
    first, added = run("t1"), run("t2", batched=True)
    running.track(first, added)
    assert running.slots_used() == 1
    running.untrack(first, added)
    assert running.slots_used() == 0
