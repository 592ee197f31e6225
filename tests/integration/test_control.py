"""Control messages to a live worker process: warm hints (preload) and junk it must survive."""

from __future__ import annotations

import pytest
from procs import Procs, est, wait_for

from gpuq import Queue, State, catalog

pytestmark = pytest.mark.slow


def test_preload_hint_loads_the_model_and_the_next_task_finds_it_warm(procs: Procs,
                                                                      real_queue: Queue) -> None:
    worker = procs.worker("w1", vram_gb=48)
    procs.redis.lpush(procs.keys.control("w1"), "preload warm-model 20")
    wait_for(lambda: procs.redis.sismember(procs.keys.holders("warm-model"), "w1"), 10,
             message=lambda: f"the preload; log:\n{worker.log()}")
    # the holding is published before the log line is written
    wait_for(lambda: "model.preloaded worker=w1 model=warm-model" in worker.log(), 5,
             message=lambda: f"the preload to be logged; log:\n{worker.log()}")
    assert procs.redis.hget(procs.keys.worker("w1"), "models") == "warm-model"
    (entry,) = catalog.read(procs.redis, procs.keys)
    assert (entry.name, entry.loads) == ("warm-model", 1)
    t = real_queue.enqueue("sim.run", {}, model="warm-model", vram_gb=20, est_s=est(0.05))
    assert t.result(timeout=10)["model"] == "warm-model"
    assert catalog.read(procs.redis, procs.keys)[0].loads == 1  # no second load
    assert worker.log().count("model.loaded") == 1


def test_preload_that_does_not_fit_is_skipped(procs: Procs) -> None:
    worker = procs.worker("w1", vram_gb=24)
    procs.redis.lpush(procs.keys.control("w1"), "preload huge 40")
    wait_for(lambda: "model.preload_skipped worker=w1 model=huge" in worker.log(), 10,
             message=lambda: f"the skip; log:\n{worker.log()}")
    assert not procs.redis.sismember(procs.keys.holders("huge"), "w1")


def test_unknown_or_malformed_messages_are_logged_and_the_worker_carries_on(
        procs: Procs, real_queue: Queue) -> None:
    worker = procs.worker("w1", vram_gb=48)
    for junk in ("reboot now", "yield", "preload m not-a-number", ""):
        procs.redis.lpush(procs.keys.control("w1"), junk)
    wait_for(lambda: worker.log().count("control.unknown") == 3 and "control.malformed" in worker.log(), 10,
             message=lambda: f"the junk to be reported; log:\n{worker.log()}")
    t = real_queue.enqueue("sim.run", {}, model="m", vram_gb=10, est_s=est(0.05))
    assert t.result(timeout=10)["worker"] == "w1"
    assert worker.alive() and procs.record(t.id).state is State.SUCCEEDED
    assert "heartbeat.error" not in worker.log()


def test_a_group_records_the_gpus_of_the_task_its_load_was_for(procs: Procs, real_queue: Queue) -> None:
    """The catalog keeps the GPUs the task a load was for asked (the forecast's warm hints
    read it), not the group's size: a one-GPU task loaded on a group records one."""
    procs.worker("g2", vram_gb=80, gpu_count=2)
    wide = real_queue.enqueue("sim.run", {}, model="wide", vram_gb=70, gpus=2, est_s=est(0.05))
    assert wide.result(timeout=10)["worker"] == "g2"
    narrow = real_queue.enqueue("sim.run", {}, model="narrow", vram_gb=10, est_s=est(0.05))
    assert narrow.result(timeout=10)["worker"] == "g2"
    got = {e.name: e.gpus for e in catalog.read(procs.redis, procs.keys)}
    assert got == {"wide": 2, "narrow": 1}
