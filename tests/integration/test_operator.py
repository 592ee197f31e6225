"""Operator tools: requeue (Queue.requeue, ``gpuq requeue``), drain (Queue.drain_worker,
``gpuq drain``) and priority lanes (``gpuq worker --priorities``).

The contract cases run on fakeredis and real Redis under a virtual clock; the CLI and
worker cases run real processes (tests/procs.py).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Callable

import pytest
from helpers import T0, ack, claim, claim_reply, enqueue, fail, heartbeat
from procs import SIM_APP, Proc, Procs, est, wait_for

from gpuq import Queue
from gpuq.errors import (
    NotRequeueable,
    ResultTimeout,
    StaleLease,
    TaskNotFound,
    WorkerNotFound,
)
from gpuq.task import State, ended_count

MakeQueue = Callable[..., Queue]
LEASE_MS = 30_000  # Config.lease_s default


def claimed(queue: Queue, worker: str = "w1", now_ms: int = T0) -> dict[str, str]:
    c = claim(queue, worker, 40, now_ms=now_ms)
    assert c is not None
    return c


def expire(queue: Queue, now_ms: int) -> tuple[int, int, int]:
    return queue.scripts.run(queue.calls.expire(now_ms=now_ms))


def assert_fresh(queue: Queue, tid: str) -> None:
    """Requeued from an ended state: queued again with fresh attempts, nothing left of the end."""
    r = queue.record(tid)
    assert r.state is State.QUEUED and r.attempt == 0
    assert r.deadline is None and r.finished_at is None
    assert r.worker is None and r.token is None
    assert r.error == "requeued by operator"
    assert queue.redis.pttl(queue.keys.task(tid)) == -1  # the result TTL is gone
    assert queue.redis.exists(queue.keys.done(tid)) == 0
    assert queue.redis.zscore(queue.keys.queue(int(r.priority), r.model), tid) is not None
    assert queue.redis.zscore(queue.keys.deadlines, tid) is None
    with pytest.raises(ResultTimeout):  # no waiter sees the old end
        queue.task(tid).result(timeout=0.2)


# --- requeue: contract ---------------------------------------------------------------------

def test_requeue_a_running_task_gives_its_attempt_back(queue: Queue) -> None:
    tid = enqueue(queue, T0, deadline_s=600)
    c = claimed(queue)
    # on the test's clock (the server's is past the deadline: it would end expired)
    assert queue.scripts.run(queue.calls.requeue(tid, None, "requeued by operator",
                                                 now_ms=T0 + 1)) == "queued"
    r = queue.record(tid)
    assert r.state is State.QUEUED and r.attempt == 0 and r.error == "requeued by operator"
    assert r.worker is None and r.token is None
    assert r.deadline == (T0 + 600_000) / 1000  # a running task keeps its deadline
    assert queue.redis.zscore(queue.keys.running, tid) is None
    assert queue.redis.smembers(queue.keys.worker_tasks("w1")) == set()
    # the worker learns it lost the lease, and its result is fenced off
    assert heartbeat(queue, "w1", [(tid, c["token"])], now_ms=T0 + 5) == [tid]
    with pytest.raises(StaleLease):
        ack(queue, tid, c["token"], "late", now_ms=T0 + 6)
    again = claimed(queue, "w2", now_ms=T0 + 7)
    assert again["id"] == tid and again["attempt"] == "1"
    assert int(again["token"]) > int(c["token"])


def test_requeue_a_delayed_task_runs_it_now(make_queue: MakeQueue) -> None:
    q = make_queue(retry_base_s=60.0)
    tid = enqueue(q, T0, max_attempts=3)
    c = claimed(q)
    assert fail(q, tid, c["token"], "oom", now_ms=T0 + 1) == "delayed"
    assert claim(q, "w1", 40, now_ms=T0 + 2) is None  # waiting out a 60 s backoff
    assert q.requeue(tid) == "queued"
    r = q.record(tid)
    assert r.state is State.QUEUED and r.attempt == 1  # the failed attempt still counts
    assert r.error == "requeued by operator"
    assert q.redis.zscore(q.keys.delayed, tid) is None
    again = claimed(q, "w1", now_ms=T0 + 3)
    assert again["id"] == tid and again["attempt"] == "2"


def test_requeue_a_task_not_yet_due_sorts_as_due_now(make_queue: MakeQueue) -> None:
    # enqueued with a delay, then sent now by the operator: its start-by score counts from
    # now, not from its old due time an hour away, so a task enqueued after it waits behind
    q = make_queue()
    a = enqueue(q, delay_s=3600, deadline_s=600, est_s=1)
    assert q.requeue(a) == "queued"
    b = enqueue(q, est_s=1)
    r = q.record(a)
    assert r.state is State.QUEUED and r.due_at is not None and r.deadline is not None
    assert r.deadline - r.due_at == pytest.approx(600, abs=0.01)  # still counted from its due time
    assert r.due_at <= q.record(b).enqueued_at
    assert claimed(q, "w1", now_ms=0)["id"] == a
    assert claimed(q, "w2", now_ms=0)["id"] == b


def test_requeue_a_task_canceled_before_its_due_time_sorts_as_due_now(make_queue: MakeQueue) -> None:
    q = make_queue()
    a = enqueue(q, delay_s=3600)
    assert q.cancel(a) is State.DELAYED
    assert q.requeue(a) == "queued"
    b = enqueue(q)
    assert q.record(a).due_at <= q.record(b).enqueued_at
    assert claimed(q, "w1", now_ms=0)["id"] == a


def test_requeue_a_failed_task_starts_it_afresh(queue: Queue) -> None:
    tid = enqueue(queue, T0, max_attempts=1, deadline_s=600)
    c = claimed(queue)
    assert queue.scripts.run(queue.calls.wait(tid)) == "running"  # a waiter: its end pushes
    assert fail(queue, tid, c["token"], "bad input", now_ms=T0 + 1) == "failed"
    assert queue.redis.pttl(queue.keys.task(tid)) > 0
    assert queue.redis.exists(queue.keys.done(tid)) == 1
    assert queue.requeue(tid) == "queued"
    assert_fresh(queue, tid)
    again = claimed(queue, "w2", now_ms=T0 + 2)
    assert again["id"] == tid and again["attempt"] == "1" and again["deadline"] == ""
    ack(queue, tid, again["token"], {"second": "try"}, now_ms=T0 + 3)
    assert queue.task(tid).result(timeout=1) == {"second": "try"}
    assert queue.redis.pttl(queue.keys.task(tid)) > 0


def test_requeue_an_expired_task_then_it_is_claimed_and_never_expires(queue: Queue) -> None:
    tid = enqueue(queue, T0, deadline_s=1, est_s=0)
    assert expire(queue, T0 + 2_000) == (1, 1, 0)
    assert queue.record(tid).state is State.EXPIRED
    assert queue.requeue(tid) == "queued"
    assert_fresh(queue, tid)
    assert expire(queue, T0 + 3_600_000) == (0, 0, 0)  # no deadline any more
    assert queue.record(tid).state is State.QUEUED
    c = claimed(queue, "w1", now_ms=T0 + 3_600_001)
    assert c["id"] == tid and c["attempt"] == "1"
    ack(queue, tid, c["token"], 7, now_ms=T0 + 3_600_002)
    assert queue.record(tid).state is State.SUCCEEDED


def test_requeue_a_canceled_task(queue: Queue) -> None:
    tid = enqueue(queue, T0)
    c = claimed(queue)
    assert queue.cancel(tid) == "running"
    assert queue.requeue(tid) == "queued"
    assert_fresh(queue, tid)
    with pytest.raises(StaleLease):  # the canceled attempt stays fenced off
        ack(queue, tid, c["token"], "late", now_ms=T0 + 5)
    again = claimed(queue, "w2", now_ms=T0 + 6)
    assert again["id"] == tid and again["attempt"] == "1"


def test_requeue_of_a_queued_or_succeeded_task_is_refused(queue: Queue) -> None:
    tid = enqueue(queue, T0)
    with pytest.raises(NotRequeueable) as err:
        queue.requeue(tid)
    assert (err.value.task_id, err.value.reason) == (tid, "task is queued: there is nothing to requeue")
    assert queue.record(tid).state is State.QUEUED
    c = claimed(queue)
    ack(queue, tid, c["token"], {"n": 1}, now_ms=T0 + 1)
    with pytest.raises(NotRequeueable) as err:
        queue.requeue(tid)
    assert str(err.value) == f"cannot requeue task {tid}: task already succeeded: there is nothing to requeue"
    r = queue.record(tid)
    assert r.state is State.SUCCEEDED and r.result == {"n": 1} and r.attempt == 1
    assert queue.redis.pttl(queue.keys.task(tid)) > 0
    with pytest.raises(TaskNotFound):
        queue.requeue("no-such-task")


# --- drain and lanes: contract -----------------------------------------------------------

def test_drain_a_live_worker_posts_on_its_control_list(queue: Queue) -> None:
    assert heartbeat(queue, "w1", []) == []  # live by the server clock
    queue.drain_worker("w1")
    assert queue.redis.lrange(queue.keys.control("w1"), 0, -1) == ["drain"]


def test_drain_an_unknown_worker_is_not_found(queue: Queue) -> None:
    with pytest.raises(WorkerNotFound) as err:
        queue.drain_worker("nobody")
    assert str(err.value) == "worker nobody is not live in this pool"
    assert queue.redis.exists(queue.keys.control("nobody")) == 0


def test_drain_a_dead_worker_is_not_found(queue: Queue) -> None:
    """A worker whose liveness lapsed (killed; the reaper has not removed it yet) is not
    live: nobody would read the message, and its control list would never expire."""
    assert heartbeat(queue, "w-dead", [], now_ms=T0) == []  # live until T0 + 30 s, long ago
    with pytest.raises(WorkerNotFound):
        queue.drain_worker("w-dead")
    assert queue.redis.exists(queue.keys.control("w-dead")) == 0


def test_a_lane_claims_only_its_priorities(queue: Queue) -> None:
    batch = enqueue(queue, T0, priority="P2")
    offline = enqueue(queue, T0, priority="P3")
    assert claim(queue, "lane", 40, levels="01", now_ms=T0 + 1) is None
    online = enqueue(queue, T0 + 2, priority="P1")
    c = claim(queue, "lane", 40, levels="01", now_ms=T0 + 3)
    assert c is not None and c["id"] == online
    assert claim(queue, "lane", 40, levels="01", now_ms=T0 + 4) is None
    general = [claim(queue, "any", 40, now_ms=T0 + 5), claim(queue, "any", 40, now_ms=T0 + 6)]
    assert [g["id"] for g in general if g] == [batch, offline]


def test_a_task_outside_a_lane_is_not_left_for_the_lane(queue: Queue) -> None:
    """An idle lane worker (P0, P1) fits a P2 task more tightly than the idle general worker,
    but can never claim it: the general worker must take it at once, not defer it for the
    lane (P2's defer bound is 2 s)."""
    assert claim(queue, "lane", 20, levels="01", now_ms=T0) is None  # idle, 20 GB claimable
    assert claim(queue, "big", 70, now_ms=T0) is None  # idle, 70 GB claimable
    tid = enqueue(queue, T0 + 1, priority="P2", vram_gb=10)
    reply = claim_reply(queue, "big", 70, now_ms=T0 + 2)
    assert reply.task is not None and reply.task["id"] == tid, (
        f"the general worker was told to look again in {reply.retry_s} s; "
        f"task offered to {queue.redis.hget(queue.keys.task(tid), 'offered')!r}")


# --- real processes ----------------------------------------------------------------------

def error_line(out: subprocess.CompletedProcess[str]) -> str:
    """The CLI's failure: exit 1, nothing on stdout, exactly one "Error:" line on stderr."""
    assert out.returncode == 1, out
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("Error: ")
    return lines[0]


def test_cli_requeue_of_a_failed_task_and_refusals(procs: Procs, real_queue: Queue) -> None:
    failed = enqueue(real_queue, max_attempts=1)
    c = claim(real_queue, "w1", 40)
    assert c is not None and c["id"] == failed
    assert fail(real_queue, failed, c["token"], "boom") == "failed"

    out = procs.cli("requeue", failed)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"requeued {failed} (queued)"
    r = real_queue.record(failed)
    assert r.state is State.QUEUED and r.attempt == 0

    # queued now: nothing to requeue
    line = error_line(procs.cli("requeue", failed))
    assert line == f"Error: cannot requeue task {failed}: task is queued: there is nothing to requeue"
    c = claim(real_queue, "w1", 40)
    assert c is not None and c["id"] == failed
    ack(real_queue, failed, c["token"], "ok")
    line = error_line(procs.cli("requeue", failed))
    assert line == (f"Error: cannot requeue task {failed}: "
                    "task already succeeded: there is nothing to requeue")
    assert real_queue.record(failed).state is State.SUCCEEDED
    assert error_line(procs.cli("requeue", "no-such-task")) == "Error: task no-such-task not found"


def test_ctrl_c_on_a_waiting_enqueue_names_the_task_it_leaves(procs: Procs, real_queue: Queue) -> None:
    """Regression: Ctrl-C on `gpuq enqueue --wait` printed "Aborted!" and exited 1; the task
    went on and its id, never printed, was lost to the user. Now stderr names it, exit 130."""
    proc = procs.start("enqueue", ["enqueue", "sim.run", "--model", "m", "--vram-gb", "1", "--wait"])
    queued = real_queue.keys.queue(2, "m")
    wait_for(lambda: procs.redis.zcard(queued) == 1, 20, message=lambda: proc.log())
    (task_id,) = procs.redis.zrange(queued, 0, -1)
    # into the wait: its first pop marked the task waited
    wait_for(lambda: procs.redis.hget(real_queue.keys.task(task_id), "waited"), 20,
             message=lambda: proc.log())
    proc.signal(signal.SIGINT)
    assert proc.wait() == 130
    assert proc.log().strip().splitlines()[-1] == (
        f"Interrupted: task {task_id} goes on (gpuq task {task_id}; gpuq cancel {task_id})")
    assert real_queue.record(task_id).state is State.QUEUED


def test_cli_drain_of_an_unknown_worker_fails(procs: Procs) -> None:
    line = error_line(procs.cli("drain", "nobody"))
    assert line == "Error: worker nobody is not live in this pool"


def worker_keys(procs: Procs, name: str) -> set[str]:
    """Keys of the pool that belong to one worker."""
    k = procs.keys
    own = {k.worker(name), k.worker_tasks(name), k.wake(name), k.control(name), k.reservation(name)}
    return {key for key in procs.redis.scan_iter(match=k.pattern, count=1000) if key in own}



def drain_once_begun(procs: Procs, worker: Proc) -> None:
    """``gpuq drain w1`` once w1 loaded its task's model (it began it: a hand-over popped but
    not yet begun when the drain lands goes back to its queue, its attempt given back)."""
    wait_for(lambda: "model.loaded" in worker.log(), timeout=10,
             message=lambda: f"w1 to load the task's model; log:\n{worker.log()}")
    assert procs.run_cli("drain", "w1").strip() == "draining w1"
    wait_for(lambda: "worker.draining" in worker.log(), timeout=5,
             message=lambda: f"w1 to start draining; log:\n{worker.log()}")


@pytest.mark.slow
def test_cli_drain_finishes_the_running_task_then_exits(procs: Procs, real_queue: Queue) -> None:
    worker = procs.worker("w1")
    first = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(1.5))
    drain_once_begun(procs, worker)
    second = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(0.1))
    assert first.status() is State.RUNNING, "the first task ended before the drain began"

    assert worker.wait(15) == 0, worker.log()
    record = first.record()
    assert (record.state, record.worker, record.attempt) == (State.SUCCEEDED, "w1", 1), \
        worker.log()
    later = second.record()
    assert later.state is State.QUEUED and later.attempt == 0 and later.worker is None
    # it left the pool cleanly: nothing of it is left behind
    assert not procs.registered("w1")
    assert procs.redis.zscore(procs.keys.idle, "w1") is None
    assert "w1" not in procs.redis.smembers(procs.keys.holders("m"))
    assert worker_keys(procs, "w1") == set()
    assert "worker.stopped" in worker.log()

    procs.worker("w2")
    assert second.result(timeout=15)["worker"] == "w2"


def test_a_sigterm_during_a_drain_bounds_it_by_the_grace(procs: Procs, real_queue: Queue) -> None:
    """Regression: a SIGTERM after ``gpuq drain`` (a pod removed while draining) was passed
    over: the worker kept running the task with no bound, until the kubelet's SIGKILL left
    it to the reaper with its attempt used."""
    worker = procs.worker("w1", env={"GPUQ_SHUTDOWN_GRACE_S": "0.5"})
    task = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(30))
    drain_once_begun(procs, worker)
    worker.terminate()
    assert worker.wait(10) == 0, worker.log()
    assert "the drain is cut to the 0.5 s grace" in worker.log()
    record = task.record()
    assert (record.state, record.attempt) == (State.QUEUED, 0), worker.log()  # given back


def start_worker(procs: Procs, name: str, *extra: str, env: dict[str, str] | None = None) -> Proc:
    args = ["worker", "--app", SIM_APP, "--vram-gb", "80", "--gpu-name", "sim-80GB",
            "--name", name, *extra]
    proc = procs.start(name, args, env)
    procs.wait_registered(proc)
    return proc


@pytest.mark.slow
def test_a_lane_worker_takes_p0_and_leaves_p2_queued(procs: Procs, real_queue: Queue) -> None:
    batch = real_queue.enqueue("sim.noop", "batch", model="m", vram_gb=10, priority="P2")
    lane = start_worker(procs, "lane", "--priorities", "P0,P1")
    assert procs.redis.hget(procs.keys.worker("lane"), "levels") == "01"
    wait_for(lambda: "levels=01" in lane.log(), 10, message=lambda: f"the start line; log:\n{lane.log()}")
    online = real_queue.enqueue("sim.noop", "online", model="m", vram_gb=10, priority="P0")
    assert online.result(timeout=15) == "online"
    assert online.record().worker == "lane"
    procs.wait_idle("lane")  # it looked again after the P0 task and found nothing
    assert batch.status() is State.QUEUED
    time.sleep(1.2)  # the scenario: one more idle block (1 s) passes, it still takes nothing
    assert batch.status() is State.QUEUED
    assert lane.alive()

    # a general worker takes it
    start_worker(procs, "general")
    assert batch.result(timeout=15) == "batch"
    assert batch.record().worker == "general"


def test_a_restart_under_a_killed_workers_name_sends_its_tasks_back_at_once(
        procs: Procs, real_queue: Queue) -> None:
    """Regression: the restart renewed the id before any reaper saw it dead, and the killed
    run's task stayed `running` until its lease expired (a minute here; no reaper runs)."""
    long_lease = {"GPUQ_LEASE_S": "60"}
    first = procs.worker("w1", env=long_lease)
    task = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(1.0))
    procs.wait_state(task.id, State.RUNNING)
    first.kill()
    first.wait(10)
    time.sleep(1.0)  # past 1.5 heartbeats (0.5 s here): the name's process stopped beating
    again = procs.worker("w1", env=long_lease)
    done = procs.wait_state(task.id, State.SUCCEEDED, timeout=20)
    assert (done.worker, done.attempt) == ("w1", 2)  # the killed run spent an attempt
    assert re.search(rf"reaper\.worker_dead pool=\S+ worker=w1 tasks={task.id}:queued", again.log())


def test_a_killed_worker_shows_silent_before_its_liveness_lapses(procs: Procs, real_queue: Queue) -> None:
    """It showed busy for the whole lease (30 s by default) after its last beat."""
    worker = procs.worker("w1", env={"GPUQ_LEASE_S": "60"})
    task = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(30.0))
    procs.wait_state(task.id, State.RUNNING)
    assert json.loads(procs.run_cli("status", "--json"))["workers"][0]["state"] == "busy"
    worker.kill()
    worker.wait(10)
    time.sleep(2.0)  # 3 heartbeats (0.5 s here) and then some
    (shown,) = json.loads(procs.run_cli("status", "--json"))["workers"]
    assert (shown["state"], shown["alive"]) == ("silent", True)
    assert re.search(r"^w1 .* silent ", procs.run_cli("status"), re.M)
    assert "0 busy, 0 idle, 1 silent;" in procs.run_cli("top", "--once")


@pytest.mark.slow
def test_requeue_of_a_running_task_fences_the_worker_and_reruns_it(
        procs: Procs, real_queue: Queue) -> None:
    """The worker's lease is fenced off: its result is discarded and the task runs again,
    with the attempt it gave back."""
    worker = procs.worker("w1")
    task = real_queue.enqueue("sim.run", model="m", vram_gb=10, est_s=est(1.0))
    first = procs.wait_state(task.id, State.RUNNING)
    assert real_queue.requeue(task.id) == "queued"
    done = procs.wait_state(task.id, State.SUCCEEDED, timeout=20)
    assert done.attempt == 1 and done.worker == "w1"
    assert done.token != first.token
    assert ended_count(procs.redis.hgetall(real_queue.keys.stats), "succeeded") == 1
    assert worker.alive()
    assert re.search(r"lease\.lost task=" + task.id, worker.log())


def test_a_second_worker_under_a_live_name_is_refused_and_a_restart_takes_over(
        procs: Procs, real_queue: Queue) -> None:
    """Regressions: a second worker started with a live worker's --name wiped its hash, tasks
    and lists (and its exit deleted them again, the first still running); a restart under the
    name of a worker killed with SIGKILL left the holdings of the dead one listed for good;
    one at once after the kill, as a supervisor restarts, was refused (exit 2, "already
    running"): it waits for the dead run to miss its beat."""
    first = procs.worker("w1")
    real_queue.enqueue("sim.noop", model="m", vram_gb=4).result(timeout=15)  # w1 holds m
    twin = procs.worker("w1", wait=False)
    assert twin.wait(15) == 2, twin.log()  # a configuration refused
    assert "worker w1 is already running" in twin.log() and "Traceback" not in twin.log()
    assert procs.redis.hget(procs.keys.worker("w1"), "models") == "m"  # untouched
    first.kill()
    first.wait(10)
    again = procs.worker("w1", wait=False)  # at once: the dead one's last beat is still fresh
    wait_for(lambda: procs.redis.hget(procs.keys.worker("w1"), "pid") == str(again.pid), timeout=15,
             message=lambda: f"the restart to register; log:\n{again.log()}")
    assert "w1" not in procs.redis.smembers(procs.keys.holders("m"))
