"""Several reaper processes on one pool: exactly one is active (it holds the pool's lock),
the others stand by; when the active one is killed a standby takes over within the lock
expiry (GPUQ_REAPER_LOCK_S = 2 s, rounds every 0.2 s: tests/procs.py).
"""

from __future__ import annotations

import re
import shlex
import sys
import time

import pytest
from procs import Proc, Procs, est, wait_for

from gpuq import Queue, State

LOCK_S = 2.0
ROUND_S = 0.2


def active_ones(reapers: list[Proc]) -> list[Proc]:
    return [r for r in reapers if "reaper.active" in r.log()]


def one_active(procs: Procs, reapers: list[Proc]) -> tuple[Proc, Proc]:
    """Wait until one reaper is active; the other must not be, several rounds later."""
    wait_for(lambda: active_ones(reapers), timeout=15,
             message=lambda: f"a reaper to take the lock; logs:\n{procs.logs()}")
    time.sleep(5 * ROUND_S)  # the scenario: the other one tries for a few rounds
    (leader,) = active_ones(reapers)
    (standby,) = [r for r in reapers if r is not leader]
    assert all(r.alive() for r in reapers), procs.logs()
    return leader, standby


def recoveries(proc: Proc) -> list[str]:
    return re.findall(r"reaper\.recovered .*", proc.log())


def kill_mid_task(procs: Procs, task_id: str, name: str) -> None:
    """Run the task on a new worker, then SIGKILL that worker mid-task."""
    worker = procs.worker(name)
    procs.wait_running_on(task_id, name)
    worker.kill()
    assert worker.wait(10) == -9


@pytest.mark.slow
def test_one_active_reaper_recovers_and_a_standby_takes_over_when_it_dies(
        procs: Procs, real_queue: Queue) -> None:
    reapers = [procs.reaper(), procs.reaper()]
    leader, standby = one_active(procs, reapers)
    token = str(procs.redis.get(real_queue.keys.reaper_lock))
    assert f"token={token[:8]}" in leader.log()

    # a dead worker's task is recovered once, by the active reaper only
    task = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(30))
    kill_mid_task(procs, task.id, "w1")
    record = procs.wait_state(task.id, State.QUEUED, timeout=15)
    assert record.attempt == 1 and record.error == "worker w1 died"
    assert not procs.registered("w1")
    wait_for(lambda: recoveries(leader), timeout=5, message="the leader to log its recovery")
    time.sleep(3 * ROUND_S)  # the scenario: more rounds pass, nothing is recovered twice
    assert len(recoveries(leader)) == 1, leader.log()
    assert "requeued=1" in recoveries(leader)[0] and "dead_workers=1" in recoveries(leader)[0]
    assert recoveries(standby) == [] and "reaper.active" not in standby.log()
    assert procs.record(task.id).attempt == 1

    # the active reaper dies; the standby takes the lock once it expires
    leader.kill()
    assert leader.wait(10) == -9
    killed_at = time.monotonic()
    wait_for(lambda: "reaper.active" in standby.log(), timeout=LOCK_S + ROUND_S + 5,
             message=lambda: f"the standby to take over; log:\n{standby.log()}")
    took = time.monotonic() - killed_at
    assert took <= LOCK_S + ROUND_S + 1.5, f"took over after {took:.2f} s"
    assert procs.redis.get(real_queue.keys.reaper_lock) not in (None, token)

    # and does the active reaper's work: the next dead worker's task comes back
    kill_mid_task(procs, task.id, "w2")
    record = procs.wait_state(task.id, State.QUEUED, timeout=15)
    assert record.attempt == 2 and record.error == "worker w2 died"
    wait_for(lambda: recoveries(standby), timeout=5, message="the new leader to log its recovery")
    assert len(recoveries(standby)) == 1
    assert not procs.registered("w2")


def test_a_standby_reaper_says_it_stands_by(procs: Procs) -> None:
    reapers = [procs.reaper(), procs.reaper()]
    _leader, standby = one_active(procs, reapers)
    wait_for(lambda: "reaper.standby" in standby.log(), timeout=3,
             message=lambda: f"the standby to log reaper.standby; log:\n{standby.log()}")


def test_a_reaper_stopped_with_sigterm_hands_the_lock_over_at_once(procs: Procs,
                                                                   real_queue: Queue) -> None:
    """A clean stop releases the lock: the standby need not wait for it to expire."""
    reapers = [procs.reaper(), procs.reaper()]
    leader, standby = one_active(procs, reapers)
    leader.terminate()
    assert leader.wait(10) == 0, leader.log()
    stopped_at = time.monotonic()
    wait_for(lambda: "reaper.active" in standby.log(), timeout=LOCK_S + 5,
             message=lambda: f"the standby to take over; log:\n{standby.log()}")
    assert time.monotonic() - stopped_at < LOCK_S, "the standby waited for the lock to expire"


@pytest.mark.slow
def test_reaper_once_runs_no_round_while_another_reaper_holds_the_lock(procs: Procs,
                                                                      real_queue: Queue) -> None:
    """The defect: `gpuq reaper --once` ran a whole round beside the active reaper (two
    recoveries, expiries and preemption passes at once)."""
    active = procs.reaper()
    wait_for(lambda: active_ones([active]), timeout=15, message=lambda: procs.logs())
    token = procs.redis.get(real_queue.keys.reaper_lock)
    out = procs.cli("reaper", "--once")
    assert out.returncode == 0 and out.stdout == "", out
    assert "another reaper holds pool" in out.stderr and "did nothing" in out.stderr
    assert procs.redis.get(real_queue.keys.reaper_lock) == token
    active.terminate()
    assert active.wait(10) == 0
    out = procs.cli("reaper", "--once")  # alone: one round, and the lock given back after it
    assert out.stdout.startswith("requeued 0, failed 0"), out
    assert procs.redis.get(real_queue.keys.reaper_lock) is None


@pytest.mark.slow
def test_a_delayed_task_enqueued_while_the_reaper_waits_is_queued_when_due(
        procs: Procs, real_queue: Queue) -> None:
    """The defect: the reaper read the first due time once and slept on it; a delayed task
    enqueued meanwhile, due sooner, was queued up to a round late (a P0 task missed its
    SLA). Rounds of 5 s here, so a round late is unmistakable; a retry in backoff goes the
    same way (lib/gates.lua add_delayed)."""
    reaper = procs.start("reaper", ["reaper"], env={"GPUQ_REAP_INTERVAL_S": "5"})
    wait_for(lambda: active_ones([reaper]), timeout=15, message=lambda: procs.logs())
    late = []
    for i in range(4):
        time.sleep(0.4 + 0.3 * i)  # at different points of the reaper's wait
        task = real_queue.enqueue("sim.noop", model="m", vram_gb=1, priority="P0", delay_s=0.5)
        record = procs.wait_state(task.id, State.QUEUED, timeout=10)
        queued_at = float(real_queue.redis.hget(real_queue.keys.task(task.id), "queued_at")) / 1000
        assert record.due_at is not None
        late.append(queued_at - record.due_at)
    assert max(late) < 1.0, late  # a round late would be up to 5 s


def test_a_reaper_stopped_with_sigterm_does_not_wait_out_a_hung_hook(procs: Procs,
                                                                      real_queue: Queue) -> None:
    """Regression: a SIGTERM'd (or Ctrl-C'd) reaper whose --on-scale command hung waited the
    hook's whole 30 s timeout before it exited (the hook's thread was joined at exit)."""
    started = procs.tmp_path / "hook-started"
    hang = shlex.join([sys.executable, "-c",
                       f"import time; open({str(started)!r}, 'w').close(); time.sleep(120)"])
    procs.worker("w1")  # its class is the one the backlog asks more of
    reaper = procs.start("reaper", ["reaper", "--on-scale", hang])
    for _ in range(20):
        real_queue.enqueue("sim.run", model="m", vram_gb=10, priority=1, est_s=60)
    wait_for(started.exists, timeout=15, message=lambda: f"the hook to run; log:\n{reaper.log()}")
    reaper.terminate()
    began = time.monotonic()
    assert reaper.wait(25) == 0, reaper.log()
    assert time.monotonic() - began < 10, reaper.log()
    assert "scale.hook_stopped" in reaper.log()
