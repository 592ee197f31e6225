"""Idle scale-down with real worker processes: past ``--idle-timeout`` a worker unloads its
models, then retires (exit 0, nothing left behind) only while more than min_workers workers
are live; at the minimum it stays and keeps serving.

Timeouts are 1 s and workers look every 0.5 s, so a decision comes 1 to 1.5 s after the
last task ended.
"""

from __future__ import annotations

import pytest
from procs import SIM_APP, Proc, Procs, est, wait_for

from gpuq import Queue, State, catalog

pytestmark = pytest.mark.slow

IDLE_S = "1"


def start_worker(procs: Procs, name: str, *extra: str, env: dict[str, str] | None = None,
                 wait: bool = True) -> Proc:
    args = ["worker", "--app", SIM_APP, "--vram-gb", "80", "--gpu-name", "sim-80GB",
            "--name", name, "--idle-timeout", IDLE_S, *extra]
    proc = procs.start(name, args, env)
    if wait:
        procs.wait_registered(proc)
    return proc


def worker_keys(procs: Procs, name: str) -> set[str]:
    k = procs.keys
    own = {k.worker(name), k.worker_tasks(name), k.wake(name), k.control(name), k.reservation(name)}
    return {key for key in procs.redis.scan_iter(match=k.pattern, count=1000) if key in own}


def assert_left_cleanly(procs: Procs, name: str, model: str) -> None:
    assert not procs.registered(name)
    assert procs.redis.zscore(procs.keys.idle, name) is None
    assert name not in procs.redis.smembers(procs.keys.holders(model))
    assert worker_keys(procs, name) == set()


def assert_loaded_and_live(procs: Procs, proc: Proc, model: str) -> None:
    """A worker that stays at the pool's minimum keeps its models: the next task starts warm."""
    assert proc.alive(), proc.log()
    assert procs.registered(proc.name)
    assert proc.name in procs.redis.smembers(procs.keys.holders(model))
    assert procs.redis.hget(procs.keys.worker(proc.name), "models") == model


def test_of_two_idle_workers_one_retires_and_one_stays(procs: Procs, real_queue: Queue) -> None:
    # lanes make each worker run exactly one of the tasks, queued before either starts
    online = real_queue.enqueue("sim.run", model="m-online", vram_gb=10, priority="P0",
                                est_s=est(0.2))
    batch = real_queue.enqueue("sim.run", model="m-batch", vram_gb=10, priority="P2",
                               est_s=est(0.2))
    env = {"GPUQ_MIN_WORKERS": "1"}
    workers = {"w-online": start_worker(procs, "w-online", env={**env, "GPUQ_PRIORITIES": "P0"},
                                        wait=False),
               "w-batch": start_worker(procs, "w-batch", env={**env, "GPUQ_PRIORITIES": "P2"},
                                       wait=False)}
    models = {"w-online": "m-online", "w-batch": "m-batch"}
    done = procs.wait_all([online.id, batch.id], State.SUCCEEDED, timeout=20)
    assert [r.worker for r in done] == ["w-online", "w-batch"]

    exited = wait_for(lambda: [p for p in workers.values() if not p.alive()], timeout=15,
                      message=lambda: f"an idle worker to retire; logs:\n{procs.logs()}")
    assert len(exited) == 1, procs.logs()
    (retired,) = exited
    (stayed,) = [p for p in workers.values() if p is not retired]
    assert retired.wait(5) == 0, retired.log()
    log = retired.log()
    assert "worker.idle_unloaded" in log and "worker.retiring" in log
    assert log.index("worker.idle_unloaded") < log.index("worker.retiring")
    assert_left_cleanly(procs, retired.name, models[retired.name])

    # the other one now decides alone: it stays, at the pool's minimum
    seen = stayed.log().count("worker.idle_stays")
    wait_for(lambda: stayed.log().count("worker.idle_stays") > seen, timeout=10,
             message=lambda: f"{stayed.name} to decide to stay; log:\n{stayed.log()}")
    assert "worker.idle_unloaded" not in stayed.log()
    assert "worker.retiring" not in stayed.log()
    assert_loaded_and_live(procs, stayed, models[stayed.name])
    assert procs.redis.zcard(procs.keys.workers) == 1


def test_a_lone_idle_worker_keeps_its_models_stays_and_still_serves(procs: Procs,
                                                                   real_queue: Queue) -> None:
    # queued first: the worker's idle clock runs from its start
    first = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(0.1))
    worker = start_worker(procs, "w1", env={"GPUQ_MIN_WORKERS": "1"}, wait=False)
    assert first.result(timeout=15)["worker"] == "w1"
    assert "w1" in procs.redis.smembers(procs.keys.holders("m"))

    wait_for(lambda: "worker.idle_stays" in worker.log(), timeout=10,
             message=lambda: f"w1 to go idle and stay; log:\n{worker.log()}")
    log = worker.log()
    assert "worker.idle_stays worker=w1 live_workers=1 models=m" in log
    assert "worker.idle_unloaded" not in log and "worker.retiring" not in log
    assert_loaded_and_live(procs, worker, "m")

    # still serving, warm: the next task finds the model loaded
    second = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(0.1))
    assert second.result(timeout=15)["worker"] == "w1"
    loads = {e.name: e.loads for e in catalog.read(procs.redis, real_queue.keys)}
    assert loads == {"m": 1}
    assert "w1" in procs.redis.smembers(procs.keys.holders("m"))
    assert worker.alive()


def test_the_reapers_min_workers_overrides_the_workers_own(procs: Procs,
                                                           real_queue: Queue) -> None:
    """min_workers 0 from the reaper (pool settings) lets even the last worker retire,
    though its own GPUQ_MIN_WORKERS says 1."""
    procs.start("reaper", ["reaper", "--min-workers", "0"])
    wait_for(lambda: procs.redis.hget(procs.keys.settings, "min_workers") == "0", timeout=10,
             message=lambda: f"the reaper to publish min_workers; logs:\n{procs.logs()}")
    task = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(0.1))
    worker = start_worker(procs, "w1", env={"GPUQ_MIN_WORKERS": "1"}, wait=False)
    assert task.result(timeout=15)["worker"] == "w1"
    assert worker.wait(15) == 0, worker.log()
    assert "worker.retiring" in worker.log()
    assert_left_cleanly(procs, "w1", "m")
