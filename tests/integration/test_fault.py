"""Faults with real processes: workers killed with SIGKILL mid-task, stale leases, races.

Leases are 2 s and heartbeats 0.5 s (tests/procs.py), so a dead worker's tasks are back in
their queue a couple of seconds after the kill.
"""

from __future__ import annotations

import json
import re
import signal
from collections import Counter

import pytest
from procs import Procs, est, wait_for

from gpuq import Queue, State
from gpuq.errors import StaleLease
from gpuq.task import ended_count

pytestmark = pytest.mark.slow


def stale_ack(queue: Queue, task_id: str, token: int) -> None:
    queue.scripts.run(queue.calls.ack(task_id, token, json.dumps({"worker": "zombie"})))


def test_sigkill_mid_task_the_reaper_requeues_and_the_result_is_written_once(
        procs: Procs, real_queue: Queue) -> None:
    w1 = procs.worker("w1")
    task = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(1.5))
    running = procs.wait_state(task.id, State.RUNNING)
    assert running.worker == "w1" and running.attempt == 1 and running.token is not None
    old_token = running.token

    w1.kill()
    assert w1.wait(10) == -9
    procs.reaper()
    procs.worker("w2")

    record = procs.wait_state(task.id, State.SUCCEEDED, timeout=20)
    assert record.attempt == 2
    assert record.worker == "w2" and record.result["worker"] == "w2"
    assert record.result["attempt"] == 2
    assert record.token != old_token
    assert ended_count(procs.redis.hgetall(real_queue.keys.stats), "succeeded") == 1

    # the dead worker's lease is stale: its ack is rejected and the result stays
    with pytest.raises(StaleLease) as info:
        stale_ack(real_queue, task.id, old_token)
    assert info.value.task_id == task.id
    after = task.record()
    assert after.result == record.result and after.finished_at == record.finished_at
    assert ended_count(procs.redis.hgetall(real_queue.keys.stats), "succeeded") == 1
    # the dead worker is gone from the pool
    assert not procs.registered("w1")
    assert procs.redis.exists(real_queue.keys.worker("w1")) == 0
    assert "w1" not in procs.redis.smembers(real_queue.keys.holders("m"))


def test_sigkill_then_reaper_once_after_lease_expiry(procs: Procs, real_queue: Queue) -> None:
    w1 = procs.worker("w1")
    task = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(1.0))
    old_token = procs.wait_state(task.id, State.RUNNING).token
    assert old_token is not None
    w1.kill()
    w1.wait(10)

    # a reaper pass before the lease expires recovers nothing
    early = procs.cli("reaper", "--once")
    assert early.returncode == 0, early.stderr
    assert early.stdout.strip().startswith("requeued 0, failed 0, dead workers 0")
    assert task.status() is State.RUNNING

    def expired() -> bool:
        now = procs.server_ms()
        lease = procs.redis.zscore(real_queue.keys.running, task.id)
        alive = procs.redis.zscore(real_queue.keys.workers, "w1")
        return lease is not None and lease < now and alive is not None and alive < now

    wait_for(expired, timeout=10, message="w1's lease and liveness to expire")
    status = procs.status()
    (dead,) = status["workers"]
    assert dead["id"] == "w1" and dead["alive"] is False and dead["running"] == [task.id]
    text = procs.cli("status").stdout
    assert "dead?" in text
    out = procs.cli("reaper", "--once")
    assert out.returncode == 0, out.stderr
    assert re.match(r"requeued 1, failed 0, dead workers 1, retries promoted 0, expired 0,",
                    out.stdout.strip())
    record = task.record()
    assert record.state is State.QUEUED
    assert record.attempt == 1  # a lost lease uses up its attempt
    assert record.worker is None and record.error == "worker w1 died"

    # an ack from the dead worker cannot land while the task is queued either
    with pytest.raises(StaleLease):
        stale_ack(real_queue, task.id, old_token)
    assert task.status() is State.QUEUED

    procs.worker("w2")
    done = procs.wait_state(task.id, State.SUCCEEDED, timeout=20)
    assert done.attempt == 2 and done.result["worker"] == "w2"
    with pytest.raises(StaleLease):
        stale_ack(real_queue, task.id, old_token)
    assert task.record().result == done.result


def test_a_task_that_keeps_killing_its_worker_ends_failed(procs: Procs, real_queue: Queue) -> None:
    """max_attempts bounds lost leases too: the reaper fails the task after the last one."""
    task = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(10.0), max_attempts=2)
    procs.reaper()
    for attempt, name in ((1, "k1"), (2, "k2")):
        worker = procs.worker(name)
        running = procs.wait_running_on(task.id, name)
        assert running.attempt == attempt
        worker.kill()
        worker.wait(10)
    record = procs.wait_state(task.id, State.FAILED, timeout=20)
    assert record.attempt == 2
    assert record.error is not None and "k2 died" in record.error and "after 2 attempts" in record.error


def test_two_workers_drain_a_backlog_each_task_once(procs: Procs, real_queue: Queue) -> None:
    procs.worker("w1", concurrency=2)
    procs.worker("w2", concurrency=2)
    tasks = real_queue.enqueue_many(
        {"handler": "sim.run", "payload": i, "model": f"m{i % 2}", "vram_gb": 10, "est_s": 0}
        for i in range(200))
    ids = [t.id for t in tasks]
    records = procs.wait_all(ids, State.SUCCEEDED, State.FAILED, State.CANCELED, timeout=60)
    assert Counter(r.state for r in records) == {State.SUCCEEDED: 200}
    assert all(r.attempt == 1 for r in records)  # nobody lost a lease, nobody ran one twice
    tokens = [r.token for r in records]
    assert len(set(tokens)) == 200  # one claim (one fencing token) per task
    assert {r.result["worker"] for r in records} == {"w1", "w2"}
    assert all(r.result["worker"] == r.worker for r in records)
    stats = procs.redis.hgetall(real_queue.keys.stats)
    assert stats["enqueued"] == "200" and ended_count(stats, "succeeded") == 200
    assert procs.redis.zcard(real_queue.keys.running) == 0


def test_killing_one_of_two_workers_mid_backlog_loses_nothing(procs: Procs,
                                                              real_queue: Queue) -> None:
    procs.reaper()
    victim = procs.worker("victim", concurrency=2)
    procs.worker("survivor", concurrency=2)
    tasks = real_queue.enqueue_many(
        {"handler": "sim.run", "payload": i, "model": "m", "vram_gb": 10, "est_s": est(0.1)}
        for i in range(60))
    ids = [t.id for t in tasks]

    def victim_busy() -> bool:
        return len(procs.redis.smembers(real_queue.keys.worker_tasks("victim"))) > 0 and any(
            r.state is State.SUCCEEDED for r in procs.records(ids))

    wait_for(victim_busy, timeout=15, message="the victim to run tasks")
    victim.kill()
    victim.wait(10)
    # what it held when it died (the reaper only clears this after its liveness expires)
    lost = set(procs.redis.smembers(real_queue.keys.worker_tasks("victim")))
    assert lost

    records = procs.wait_all(ids, State.SUCCEEDED, State.FAILED, timeout=40)
    assert Counter(r.state for r in records) == {State.SUCCEEDED: 60}
    assert ended_count(procs.redis.hgetall(real_queue.keys.stats), "succeeded") == 60  # each result once
    retried = {r.id for r in records if r.attempt == 2}
    assert retried <= lost and retried  # only what the victim held ran again
    assert all(r.attempt == 1 for r in records if r.id not in lost)
    by_id = {r.id: r for r in records}
    assert all(by_id[i].result["worker"] == "survivor" for i in retried)


def test_a_task_offered_to_a_worker_that_died_idle_runs_on_another(procs: Procs,
                                                                     real_queue: Queue) -> None:
    dead = procs.worker("w-small", vram_gb=24)  # the tighter fit: enqueue offers it the task
    procs.worker("w-big", vram_gb=80, env={"GPUQ_IDLE_BLOCK_S": "10"})
    for name in ("w-small", "w-big"):
        procs.wait_idle(name)
    dead.kill()
    dead.wait()
    # still in the idle set (its lease has not run out): the task is handed over to it, and
    # the pool-wide token enqueue posts while other workers idle wakes w-big, which takes it
    # back once its pickup deadline (P1: 500 ms) has passed, not at its next idle wake-up (10 s)
    t = real_queue.enqueue("sim.noop", model="m", vram_gb=10, priority="P1")
    assert real_queue.record(t.id).worker == "w-small"
    done = procs.wait_state(t.id, State.SUCCEEDED, timeout=15)
    assert done.worker == "w-big"
    assert done.started_at is not None and done.enqueued_at is not None
    assert done.started_at - done.enqueued_at < 3


def test_paused_worker_loses_its_lease_and_its_late_result_is_rejected(
        procs: Procs, real_queue: Queue) -> None:
    """A worker frozen past its lease (GC pause, partition) comes back to a task that another
    worker now runs: its result is fenced off, and it carries on as a healthy worker."""
    procs.reaper()
    w1 = procs.worker("w1")
    task = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(1.0))
    procs.wait_state(task.id, State.RUNNING)
    w1.signal(signal.SIGSTOP)
    procs.worker("w2")
    procs.wait_running_on(task.id, "w2")
    w1.signal(signal.SIGCONT)

    record = procs.wait_state(task.id, State.SUCCEEDED, timeout=15)
    assert record.attempt == 2 and record.result["worker"] == "w2"
    wait_for(lambda: "lease.lost" in w1.log(), message="w1 to notice its lost lease")
    assert ended_count(procs.redis.hgetall(real_queue.keys.stats), "succeeded") == 1
    assert task.record().result == record.result
    # w1 is alive and back in the pool
    wait_for(lambda: procs.registered("w1"), message="w1 to rejoin the pool")
    assert w1.alive()


def test_standby_reaper_takes_over_when_the_active_one_dies(procs: Procs,
                                                            real_queue: Queue) -> None:
    reapers = [procs.reaper(), procs.reaper()]
    active = wait_for(lambda: [r for r in reapers if "reaper.active" in r.log()],
                      message="one reaper to take the lock")
    assert len(active) == 1  # one active reaper per pool
    (leader,) = active
    (standby,) = [r for r in reapers if r is not leader]
    leader.kill()
    leader.wait(10)

    w1 = procs.worker("w1")
    task = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(1.5))
    procs.wait_state(task.id, State.RUNNING)
    w1.kill()
    w1.wait(10)
    procs.worker("w2")
    record = procs.wait_state(task.id, State.SUCCEEDED, timeout=20)
    assert record.attempt == 2 and record.result["worker"] == "w2"
    assert "reaper.active" in standby.log()


def test_worker_killed_while_idle_does_not_delay_the_next_task(procs: Procs,
                                                                real_queue: Queue) -> None:
    """A dead worker still listed idle must not swallow the wake-up of a task that a live
    idle worker could start at once (idle workers block up to GPUQ_IDLE_BLOCK_S = 5 s)."""
    slow_block = {"GPUQ_IDLE_BLOCK_S": "5"}
    w1 = procs.worker("w1", env=slow_block)
    real_queue.enqueue("sim.noop", model="m", vram_gb=4).result(timeout=15)  # w1 holds m
    procs.worker("w2", env=slow_block)
    for name in ("w1", "w2"):
        procs.wait_idle(name)
    w1.kill()
    w1.wait(10)
    task = real_queue.enqueue("sim.noop", model="m", vram_gb=4, priority="online")
    record = procs.wait_state(task.id, State.SUCCEEDED, timeout=15)
    assert record.worker == "w2"
    # P0's start SLA is 0.2 s; allow slack for a loaded machine, but not an idle block
    assert record.started_at - record.enqueued_at < 1.0


def test_a_task_handed_to_a_worker_frozen_while_idle_is_taken_back_at_its_pickup_deadline(
        procs: Procs, real_queue: Queue) -> None:
    """SIGSTOP while blocked on its wake list: the server still pops the hand-over for it,
    and its liveness and lease (60 s here) hold. Not taken up by its pickup deadline (P0:
    100 ms), the task is taken back and runs elsewhere long before the frozen worker is
    found dead; the frozen worker, let go, does not run it."""
    procs.reaper()
    frozen = procs.worker("w1", env={"GPUQ_LEASE_S": "60", "GPUQ_HEARTBEAT_S": "20",
                                     "GPUQ_IDLE_BLOCK_S": "60"})
    procs.wait_idle("w1")
    frozen.signal(signal.SIGSTOP)
    try:
        task = real_queue.enqueue("sim.noop", model="m", vram_gb=4, priority="P0")
        assert real_queue.record(task.id).worker == "w1"
        wait_for(lambda: procs.redis.llen(real_queue.keys.wake("w1")) == 0,
                 message="the server to pop the hand-over for the frozen worker")
        procs.worker("w2")
        record = procs.wait_state(task.id, State.SUCCEEDED, timeout=20)
        assert (record.worker, record.attempt) == ("w2", 1)  # the first attempt given back
        assert procs.registered("w1")  # taken back, not recovered from a dead worker
    finally:
        frozen.signal(signal.SIGCONT)
    wait_for(lambda: "taken back before it was taken up" in frozen.log(),
             message=lambda: f"w1 to drop the task it was handed; log:\n{frozen.log()}")
    assert ended_count(procs.redis.hgetall(real_queue.keys.stats), "succeeded") == 1
    assert frozen.alive()
