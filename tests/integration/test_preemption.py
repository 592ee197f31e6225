"""Graceful preemption with real worker and reaper processes running workers/sim.py.

A P0 task arrives while every simulated GPU runs P3 work. The reaper reserves the GPU whose
task ends within max_wait (nothing is interrupted), or asks a long task to yield (it keeps
its checkpoint and its attempt), or has the worker stop a task that ignores the request;
a handler stuck in native code makes its worker exit with EXIT_STUCK, its task requeued once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import Procs, est, wait_for

from gpuq import Queue, State
from gpuq.embedded import EmbeddedServer
from gpuq.worker.control import EXIT_STUCK

pytestmark = pytest.mark.slow

PREEMPT_ENV = {"GPUQ_MAX_WAIT_S": "1", "GPUQ_GRACE_S": "1.5", "GPUQ_PREEMPT_MIN_RUNTIME_S": "0.2",
               "GPUQ_STOP_S": "1.5"}


@pytest.fixture
def procs(redis_server: EmbeddedServer, pool: str, prefix: str, tmp_path: Path) -> Iterator[Procs]:
    with Procs(redis_server.url, pool, prefix, tmp_path, **PREEMPT_ENV) as p:
        yield p


def p3(q: Queue, seconds: float, payload: Any = None, *, preemptible: bool = True,
       model: str = "batch-model") -> str:
    """A P3 task; a second one meant to run beside the first names another model: batch work
    waits for a busy holder of its model (from the start of its load) rather than load it on
    an idle GPU."""
    return q.enqueue("sim.run", payload, model=model, vram_gb=30, priority="P3",
                     est_s=est(seconds), preemptible=preemptible).id


def p0(q: Queue) -> str:
    return q.enqueue("sim.run", {}, model="online-model", vram_gb=30, priority="P0",
                     est_s=est(0.3)).id


def stats(procs: Procs) -> dict[str, int]:
    return {k: int(v) for k, v in procs.redis.hgetall(procs.keys.stats).items()}


def active_reaper(procs: Procs, **env: str) -> None:
    reaper = procs.reaper(env=env)
    wait_for(lambda: "reaper.active" in reaper.log(), 15, message="the reaper to become active")


def test_victim_ending_within_max_wait_is_waited_for(procs: Procs, real_queue: Queue) -> None:
    procs.worker("w-short", vram_gb=48)
    procs.worker("w-long", vram_gb=48)
    # the planner reads estimates in simulated seconds (est_s, before GPUQ_SIM_TIME_SCALE):
    # the short task's 2.5 s of wall time is est(2.5) = 25 s to it. While the P0's start-by
    # time lies ahead, a victim that has run its minimum would be asked to yield (that saves
    # the SLA); a minimum no victim reaches here leaves waiting as the only decision, however
    # slowly the host brings the victims up
    active_reaper(procs, GPUQ_MAX_WAIT_S=str(est(5.0)), GPUQ_PREEMPT_MIN_RUNTIME_S="60")
    short = p3(real_queue, 2.5)
    procs.wait_state(short, State.RUNNING)
    long = p3(real_queue, 20.0, model="batch-model-2")
    procs.wait_state(long, State.RUNNING)
    urgent = p0(real_queue)
    done = procs.wait_state(urgent, State.SUCCEEDED, timeout=20)
    first = procs.record(short)
    assert first.state is State.SUCCEEDED and first.attempt == 1  # not interrupted
    assert done.worker == first.worker  # the GPU that freed first, right after its task
    assert done.started_at is not None and first.finished_at is not None
    assert 0 <= done.started_at - first.finished_at < 1.0
    running = procs.record(long)
    assert running.state is State.RUNNING and running.attempt == 1
    assert stats(procs).get("preempt:reserved", 0) == 1
    assert stats(procs).get("preempt:yield_requested", 0) == 0


def test_long_victim_yields_with_its_checkpoint_and_keeps_its_attempt(procs: Procs,
                                                                      real_queue: Queue) -> None:
    procs.worker("w1", vram_gb=48)
    victim = p3(real_queue, 6.0)
    procs.wait_state(victim, State.RUNNING)
    procs.reaper()
    urgent = p0(real_queue)
    enqueued = procs.record(urgent).enqueued_at
    done = procs.wait_state(urgent, State.SUCCEEDED, timeout=20)
    assert done.worker == "w1"
    assert done.started_at is not None and enqueued is not None
    # one reaper round, the yield message, the yield and the claim: well within the grace
    assert done.started_at - enqueued < 1.5
    result = real_queue.task(victim).result(timeout=30)
    assert result["attempt"] == 1  # the yield gave its attempt back
    assert result["resumed_from_s"] > 0  # the next run got the checkpoint
    fields = procs.redis.hgetall(procs.keys.task(victim))
    assert fields["preemptions"] == "1"
    assert '"done_s"' in fields["checkpoint"]
    s = stats(procs)
    assert s["preempt:yield_requested"] == 1 and s["preempt:yielded"] == 1
    assert s.get("preempt:stopped", 0) == 0


def test_a_victim_coming_of_age_is_asked_then_not_at_the_next_round(procs: Procs,
                                                                    real_queue: Queue) -> None:
    procs.worker("w1", vram_gb=48)
    # rounds a minute apart: only the planner's own word (when the victim has run its 1.5 s
    # minimum) can bring the pass that asks it to yield forward
    active_reaper(procs, GPUQ_REAP_INTERVAL_S="60", GPUQ_PREEMPT_MIN_RUNTIME_S="1.5")
    victim = p3(real_queue, 20.0)
    began = procs.wait_state(victim, State.RUNNING).started_at
    urgent = p0(real_queue)  # its urgent pass finds the victim too young
    done = procs.wait_state(urgent, State.SUCCEEDED, timeout=20)
    assert done.worker == "w1" and done.started_at is not None and began is not None
    assert 1.5 <= done.started_at - began < 4
    assert stats(procs)["preempt:yielded"] == 1


def test_a_yield_request_is_withdrawn_when_its_task_starts_elsewhere(procs: Procs,
                                                                      real_queue: Queue) -> None:
    procs.worker("w-free", vram_gb=48)
    procs.wait_idle("w-free")
    # ends before the victim's grace runs out, not before the P0 task comes: the second
    # worker's and the reaper's start (a second or two each on a loaded host) come between
    pinned = p3(real_queue, 5.0, preemptible=False)  # may not be preempted
    procs.wait_state(pinned, State.RUNNING)
    slow = procs.worker("w-slow", vram_gb=48)
    procs.wait_idle("w-slow")
    # slow to give way; of another model, so it does not wait for w-free holding batch-model
    victim = real_queue.enqueue("sim.run", {"ignore_yield": True}, model="other-batch-model",
                                vram_gb=30, priority="P3", est_s=est(8.0)).id
    procs.wait_state(victim, State.RUNNING)
    active_reaper(procs, GPUQ_GRACE_S="5")
    urgent = p0(real_queue)  # w-slow's task is asked to yield within 5 s
    assert real_queue.task(pinned).record().state == State.RUNNING  # else nothing to withdraw
    done = procs.wait_state(urgent, State.SUCCEEDED, timeout=20)
    assert done.worker == "w-free"  # it freed up first: the request is withdrawn
    result = real_queue.task(victim).result(timeout=30)
    assert result["attempt"] == 1 and result["resumed_from_s"] == 0  # never stopped
    assert "preempt.withdrawn task=" + victim in slow.log()
    s = stats(procs)
    assert s["preempt:yield_requested"] == 1 and s["preempt:withdrawn"] == 1
    assert s.get("preempt:stopped", 0) == 0


def test_victim_ignoring_the_request_is_stopped_and_requeued_once(procs: Procs,
                                                                  real_queue: Queue) -> None:
    worker = procs.worker("w1", vram_gb=48)
    victim = p3(real_queue, 8.0, {"ignore_yield": True})
    procs.wait_state(victim, State.RUNNING)
    procs.reaper()
    urgent = p0(real_queue)
    done = procs.wait_state(urgent, State.SUCCEEDED, timeout=20)
    assert done.worker == "w1" and worker.alive()  # stopped in-process: no restart needed
    wait_for(lambda: "preempt.stopped" in worker.log(), 5, message="the stop to be logged")
    result = real_queue.task(victim).result(timeout=30)
    assert result["attempt"] == 1
    fields = procs.redis.hgetall(procs.keys.task(victim))
    assert fields["preemptions"] == "1"
    s = stats(procs)
    assert s["preempt:stopped"] == 1 and s.get("preempt:yielded", 0) == 0
    assert worker.log().count("preempt.stopped task=") == 1


def test_a_victim_asked_while_its_model_loads_yields_before_its_handler_starts(
        procs: Procs, real_queue: Queue) -> None:
    # the 70B model loads for 5.5 s (workers/sim.py, scaled); with no minimum runtime the
    # planner may ask a victim still loading (otherwise it waits for the worker's began),
    # and asks at once, mid-load. The handler would ignore the request: the worker gives way
    # for it once the load ends, within the grace
    worker = procs.worker("w1", vram_gb=80)
    active_reaper(procs, GPUQ_GRACE_S="10", GPUQ_PREEMPT_MIN_RUNTIME_S="0")
    victim = real_queue.enqueue("sim.run", {"ignore_yield": True}, model="llama3-70b", vram_gb=70,
                                priority="P3", est_s=est(20.0)).id
    began = procs.wait_state(victim, State.RUNNING).started_at
    urgent = p0(real_queue)
    done = procs.wait_state(urgent, State.SUCCEEDED, timeout=20)
    assert done.worker == "w1" and worker.alive() and began is not None
    assert done.started_at is not None and 5.5 <= done.started_at - began < 8
    wait_for(lambda: "preempt.yielded task=" + victim in worker.log(), 5, message="the yield")
    record = procs.record(victim)
    assert record.attempt in (0, 1) and record.preemptions == 1  # given back, maybe running again
    s = stats(procs)
    assert s["preempt:yielded"] == 1 and s.get("preempt:stopped", 0) == 0


def test_handler_stuck_in_native_code_makes_the_worker_exit_and_requeues_once(
        procs: Procs, real_queue: Queue) -> None:
    worker = procs.worker("w1", vram_gb=48)
    victim = p3(real_queue, 30.0, {"uninterruptible": True})
    procs.wait_state(victim, State.RUNNING)
    procs.reaper()
    urgent = p0(real_queue)
    assert worker.wait(timeout=20) == EXIT_STUCK
    assert "worker.stuck" in worker.log()
    record = procs.record(victim)
    assert record.state is State.QUEUED and record.attempt == 0
    assert procs.redis.hget(procs.keys.task(victim), "preemptions") == "1"
    assert not procs.registered("w1")  # it left before exiting
    procs.worker("w1-restarted", vram_gb=48)  # the supervisor's restart
    assert procs.wait_state(urgent, State.SUCCEEDED, timeout=20).worker == "w1-restarted"
    assert stats(procs)["preempt:stopped"] == 1


def test_non_preemptible_task_is_never_chosen(procs: Procs, real_queue: Queue) -> None:
    procs.worker("w1", vram_gb=48)
    procs.worker("w2", vram_gb=48)
    # the non-preemptible task ends sooner: it would be the victim were it preemptible
    pinned = p3(real_queue, 5.0, preemptible=False)
    procs.wait_state(pinned, State.RUNNING)
    other = p3(real_queue, 8.0, model="batch-model-2")
    other_worker = procs.wait_state(other, State.RUNNING).worker
    procs.reaper()
    urgent = p0(real_queue)
    done = procs.wait_state(urgent, State.SUCCEEDED, timeout=20)
    assert done.worker == other_worker
    kept = procs.record(pinned)
    assert kept.state in (State.RUNNING, State.SUCCEEDED) and kept.attempt == 1
    assert procs.redis.hget(procs.keys.task(pinned), "preemptions") is None
    assert procs.redis.hget(procs.keys.task(other), "preemptions") == "1"


def test_only_non_preemptible_work_running_means_no_preemption(procs: Procs,
                                                               real_queue: Queue) -> None:
    procs.worker("w1", vram_gb=48)
    pinned = p3(real_queue, 2.0, preemptible=False)
    procs.wait_state(pinned, State.RUNNING)
    reaper = procs.reaper()
    urgent = p0(real_queue)
    done = procs.wait_state(urgent, State.SUCCEEDED, timeout=20)
    first = procs.record(pinned)
    assert first.state is State.SUCCEEDED and first.attempt == 1
    assert first.finished_at is not None and done.started_at is not None
    assert done.started_at >= first.finished_at
    assert "preempt." not in reaper.log()


def test_no_victim_is_asked_for_a_task_whose_handler_no_live_worker_runs(procs: Procs,
                                                                        real_queue: Queue) -> None:
    """A P0 task naming a handler no app registers (a typo) would only be failed by the
    worker that gives way for it: the planner passes over it, to the next urgent task."""
    procs.worker("w1", vram_gb=48)
    victim = p3(real_queue, 6.0)
    procs.wait_state(victim, State.RUNNING)
    reaper = procs.reaper()
    typo = real_queue.enqueue("sim.rnu", {}, model="online-model", vram_gb=30, priority="P0",
                              est_s=est(0.3)).id
    urgent = p0(real_queue)  # queued behind the typo, same model
    done = procs.wait_state(urgent, State.SUCCEEDED, timeout=20)
    assert done.worker == "w1"
    assert procs.wait_state(typo, State.FAILED, timeout=20).error == \
        "handler 'sim.rnu' is not registered in app 'sim'"
    assert f"task={urgent} " in reaper.log()
    assert typo not in reaper.log()
    assert stats(procs)["preempt:yield_requested"] == 1


def test_an_urgent_enqueue_wakes_the_reaper_between_its_rounds(procs: Procs,
                                                               real_queue: Queue) -> None:
    # rounds 8 s apart: only the urgent token the P0's enqueue posts can make it act sooner
    procs.worker("w1", vram_gb=48)
    victim = p3(real_queue, 20.0)
    started = procs.wait_state(victim, State.RUNNING).started_at
    reaper = procs.reaper(env={"GPUQ_REAP_INTERVAL_S": "8"})
    # its first round ends with the scale step (it writes the scale hash): after that only
    # the urgent wake can make it plan before the next round
    wait_for(lambda: procs.redis.exists(procs.keys.scale) == 1, 15, message="the reaper's first round")
    # the victim must have run its minimum (0.2 s) when the P0 comes, or the pass finds no one
    # to ask and the P0 waits for the next round
    assert started is not None
    time.sleep(max(0.0, started + 0.5 - time.time()))
    urgent = p0(real_queue)
    enqueued = procs.record(urgent).enqueued_at
    done = procs.wait_state(urgent, State.SUCCEEDED, timeout=20)
    assert done.started_at is not None and enqueued is not None
    assert done.started_at - enqueued < 4.0, reaper.log()  # well before the next round
    assert "reaper.urgent" in reaper.log()
    assert stats(procs)["preempt:yield_requested"] == 1
    assert procs.redis.llen(procs.keys.urgent) == 0  # the reaper took the token


def test_online_work_takes_the_busy_gpu_holding_its_model_rather_than_load_it_cold(
        procs: Procs, real_queue: Queue) -> None:
    # a P0 SLA of 5 s (defer bound 2 s) gives the yield time on these shared machines; the
    # replay (yields at once) shows the 200 ms case
    env = {"GPUQ_SLA_P0_S": "5"}
    procs.worker("holder", vram_gb=48, env=env)
    victim = real_queue.enqueue("sim.run", {}, model="shared", vram_gb=30, priority="P3",
                                est_s=est(20.0)).id
    procs.wait_state(victim, State.RUNNING)
    procs.worker("cold", vram_gb=48, env=env)  # idle, without the model
    # the reactive signal: under the forecast the scaler may warm "shared" on the idle GPU
    # ahead of demand (gpuq/reaper/scale_ahead.py), and no copy is what this case is about
    active_reaper(procs, **env, GPUQ_SCALE_SIGNAL="reactive")
    urgent = real_queue.enqueue("sim.run", {}, model="shared", vram_gb=30, priority="P0",
                                est_s=est(0.3)).id
    assert procs.redis.hget(procs.keys.task(urgent), "offered") == "holder"
    done = procs.wait_state(urgent, State.SUCCEEDED, timeout=20)
    assert done.worker == "holder"  # its model was loaded there: no cold start
    assert procs.redis.hget(procs.keys.task(victim), "preemptions") == "1"
    assert stats(procs)["preempt:yield_requested"] == 1
    assert procs.redis.sismember(procs.keys.holders("shared"), "cold") == 0
