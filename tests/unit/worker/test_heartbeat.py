"""The heartbeat's reading of lost leases (gpuq.worker.heartbeat.Heartbeat.beat), on fakeredis."""

from __future__ import annotations

import logging
from typing import Any

import fakeredis
import pytest
import redis

from gpuq import Config, Queue, worker_record
from gpuq.app import Context
from gpuq.clock import server_ms
from gpuq.worker.executor import Claimed
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.loop import Worker
from gpuq.worker.running import Running
from workers.sim import app


def claimed(concurrency: int = 1) -> tuple[Queue, Worker, Any, Claimed]:
    """A worker on fakeredis that claimed the one task enqueued: the queue, the worker, the
    task's handle and what the claim gave the worker."""
    client = fakeredis.FakeRedis(decode_responses=True)
    config = Config(pool="hb", concurrency=concurrency).validate()
    queue = Queue(client, config)
    worker = Worker(client, config, app, GpuInfo("sim", "x", 80, None, "declared"), worker_id="w")
    worker.presence.register(worker_record.identity("w", worker.gpu, 5, concurrency, "0123", "h", 1),
                             30_000)
    task = queue.enqueue("sim.noop", 1, model="m", vram_gb=1)
    got = worker.claim(None)
    assert isinstance(got, tuple)
    return queue, worker, task, got[0]


def test_a_task_acked_during_the_beat_is_not_reported_lost(caplog: pytest.LogCaptureFixture) -> None:
    """Regression: the beat snapshots the running tasks, then its script call; a runner's ack
    landing in between made the script report the task's lease gone, and the beat logged
    ``lease.lost`` for a task that had succeeded."""
    _, worker, task, (_, _, running) = claimed()
    beat_call = worker.calls.heartbeat

    def ack_lands_first(*args: object, **kwargs: object) -> object:
        worker.running.untrack(running.task_id)
        worker.scripts.run(worker.calls.ack(running.task_id, running.token, "1"))
        return beat_call(*args, **kwargs)  # type: ignore[arg-type]

    worker.calls.heartbeat = ack_lands_first  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        worker.heartbeat().beat()
    assert task.status().value == "succeeded"
    assert not running.ctx.lost
    assert "lease.lost" not in caplog.text


def test_a_finished_run_keeps_its_lease_until_its_ack_is_answered() -> None:
    """The ack rides with the runner's next claim, which an outage holds back: until it is
    answered the run's lease is renewed, or a reaper would take back a finished task (and
    refuse its result) once the lease ran out; an answered or lost one is renewed no more."""
    queue, worker, _, (fields, res, running) = claimed()
    ack = worker.executor.execute(fields, res, running)
    assert ack is not None and not worker.running.slots_used()
    assert worker.running.settling() == [(running.task_id, running.token)]
    queue.redis.zadd(queue.keys.running, {running.task_id: 0})  # as if its lease had nearly run out
    worker.heartbeat().beat()
    assert float(queue.redis.zscore(queue.keys.running, running.task_id)) > 0
    worker.settle([ack])
    assert worker.running.settling() == []
    assert queue.record(running.task_id).state.value == "succeeded"


def test_a_finished_run_whose_lease_is_gone_is_dropped_from_the_renewals() -> None:
    _, worker, task, (fields, res, running) = claimed()
    assert worker.executor.execute(fields, res, running) is not None
    task.cancel()
    worker.heartbeat().beat()
    assert worker.running.settling() == []


def asked_to_yield(queue: Queue, task_id: str) -> None:
    """What preempt.lua writes into a victim's hash with its "yield" message."""
    queue.redis.hset(queue.keys.task(task_id), mapping={"yield_by": "1", "yield_for": "t-p0"})


def test_a_victim_stopped_past_its_yield_deadline_keeps_its_saved_checkpoint() -> None:
    """Regression: the stop requeued the victim without the checkpoint its handler had saved
    (ctx.save_checkpoint), so its next run started over; a yield kept it."""
    queue, worker, task, (_, _, running) = claimed()
    running.ctx.save_checkpoint({"done_s": 123})
    control = worker.heartbeat().control
    asked_to_yield(queue, task.id)
    control.on_yield(task.id, 0)
    control.watch()  # past its deadline: stopped and requeued
    record = queue.record(task.id)
    assert running.stopped and record.state.value == "queued"
    assert record.checkpoint == {"done_s": 123}


def test_a_victim_stopped_past_its_deadline_is_counted_with_its_run_phase(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a QA pass: the stop counted the victim "stopped" and dropped its metrics
    label before its handler returned, so its run (13 s there) was missing from the run
    phase. It is counted once the handler returns, after its run phase."""
    from gpuq.metrics import WorkerMetrics

    queue, worker, task, (fields, res, running) = claimed()
    metrics = worker.executor.observer.metrics = WorkerMetrics("hb", "w", "sim")
    worker.executor.observer.started(fields)
    monkeypatch.setattr(type(running), "interrupt", lambda r: True)
    control = worker.heartbeat().control

    def handler_runs_past_its_deadline(*args: Any) -> str:
        asked_to_yield(queue, task.id)
        control.on_yield(task.id, 0)
        control.watch()  # past its deadline: requeued and stopped while the handler runs
        assert running.stopped and queue.record(task.id).state.value == "queued"
        return "done anyway"

    monkeypatch.setattr(worker.executor, "invoke", handler_runs_past_its_deadline)
    assert worker.executor.execute(fields, res, running) is None  # it returns: nothing to send

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"pool": "hb", "priority": "P2", **labels})

    assert sample("gpuq_worker_tasks_total", gpu="w", outcome="stopped") == 1
    assert sample("gpuq_task_phase_seconds_count", phase="run") == 1


def test_a_stop_after_the_yield_was_withdrawn_keeps_the_task_running() -> None:
    """Regression: the yield was withdrawn in Redis (the waiting task started elsewhere)
    just before its deadline, and the worker reached the deadline before it read
    "unyield": the stop still requeued the task, throwing its work away."""
    queue, worker, task, (_, _, running) = claimed()
    control = worker.heartbeat().control
    control.on_yield(task.id, 0)  # asked, then withdrawn: its hash holds no yield_by
    control.watch()
    record = queue.record(task.id)
    assert record.state.value == "running" and record.preemptions == 0
    assert not running.stopped and not running.ctx.lost
    assert running.yield_deadline is None and not running.ctx.should_yield()
    assert "preempt:stopped" not in queue.redis.hgetall(queue.keys.stats)


def test_a_stop_that_redis_did_not_answer_is_tried_again() -> None:
    """Regression: the stop marked the task stopped before its requeue, so a Redis error
    left a task nobody would requeue (its handler's result dropped as moot) until the
    reaper took it back with an attempt used."""
    queue, worker, task, (_, _, running) = claimed()
    control = worker.heartbeat().control
    asked_to_yield(queue, task.id)
    control.on_yield(task.id, 0)
    run = worker.scripts.run

    def down(*args: object, **kwargs: object) -> object:
        raise redis.ConnectionError("down")

    worker.scripts.run = down  # type: ignore[method-assign]
    with pytest.raises(redis.ConnectionError):
        control.watch()
    assert not running.stopped
    worker.scripts.run = run  # type: ignore[method-assign]
    control.watch()
    assert running.stopped and queue.record(task.id).state.value == "queued"


def test_a_canceled_task_still_running_is_stopped_once_the_grace_passes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a QA pass: a canceled task whose handler did not check ctx.should_stop()
    ran to its end (58 s) while the worker, its task set empty, looked idle and took
    nothing, and a P0 task waited for it. The beat that learns of the lost lease sets
    should_stop(); past the grace the handler is stopped, nothing requeued."""
    queue, worker, task, (_, _, running) = claimed()
    interrupted: list[str] = []
    monkeypatch.setattr(type(running), "interrupt", lambda r: interrupted.append(r.task_id) or True)
    heartbeat = worker.heartbeat()
    task.cancel()
    heartbeat.beat()
    assert running.ctx.should_stop() and running.lost_deadline is not None
    assert heartbeat.control.watch() <= worker.config.grace_s and not running.stopped
    running.in_handler = True  # its handler runs on, not checking should_stop()
    running.lost_deadline = 0.0  # the grace is over
    heartbeat.control.watch()
    assert running.stopped and interrupted == [task.id] and running.stop_deadline is not None
    assert queue.record(task.id).state.value == "canceled"  # nothing requeued


def test_a_task_lost_while_its_model_loads_never_starts_and_is_no_stuck_handler(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel during a long load (55 s for a 70B model): past the grace the task is marked
    stopped (its handler will not start), not interrupted, and no stop deadline is set: a
    load is no stuck handler, and the worker must not exit for it."""
    _, worker, task, (_, _, running) = claimed()
    interrupted: list[str] = []
    monkeypatch.setattr(type(running), "interrupt", lambda r: interrupted.append(r.task_id) or True)
    control = worker.heartbeat().control
    control.on_lost(running)
    running.lost_deadline = 0.0
    control.watch()
    assert running.stopped and interrupted == [] and running.stop_deadline is None
    assert running.lost_deadline is not None  # looked at again: a handler started meanwhile is stopped
    running.in_handler, running.lost_deadline = True, 0.0
    control.watch()
    assert interrupted == [task.id] and running.stop_deadline is not None


def test_a_batch_with_a_task_it_still_holds_is_not_stopped_for_a_lost_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's tasks share one handler call: it stops only once every one of them is lost."""
    _, worker, task, (_, _, running) = claimed()
    other = Running("t-other", 1, Context("t-other", 1, worker.id, "m", 1.0, 1.0), 0.0, running.thread_id)
    worker.running.track(other)
    interrupted: list[str] = []
    monkeypatch.setattr(Running, "interrupt", lambda r: interrupted.append(r.task_id) or True)
    control = worker.heartbeat().control
    running.in_handler = other.in_handler = True
    control.on_lost(running)
    running.lost_deadline = 0.0
    control.watch()
    assert not running.stopped and not other.stopped and interrupted == []
    control.on_lost(other)
    other.lost_deadline = 0.0
    control.watch()
    assert running.stopped and other.stopped and len(interrupted) == 1


def test_a_cancel_tells_the_worker_at_once_not_at_its_next_beat() -> None:
    """Found by a QA pass: a cancel's should_stop() came 1.1-5.8 s late, at the worker's next
    beat. cancel.lua pushes "lost <id> <token>" on its control list; the worker reads it at
    once (only for the run under that token)."""
    queue, worker, task, (_, _, running) = claimed()
    control = worker.heartbeat().control
    task.cancel()
    message = control.receive(0.1)
    assert message == f"lost {task.id} {running.token}"
    control.handle(f"lost {task.id} {running.token + 1}")  # another run's: not this one
    assert not running.ctx.should_stop()
    control.handle(message)
    assert running.ctx.should_stop() and running.lost_deadline is not None


def test_a_reservation_message_nudges_a_waiting_batch() -> None:
    _, worker, _, _ = claimed()
    control = worker.heartbeat().control
    control.handle("reserved t-p0")
    assert worker.running.reservations == 1


def test_a_worker_revived_after_redis_lost_its_data_publishes_its_class_again() -> None:
    """Regression: after a Redis restart without its data, live workers restored their
    holdings only: no GPU class or handler was listed again, so status called fitting tasks
    unschedulable and enqueue --check-fit refused everything."""
    queue, worker, _, _ = claimed()
    queue.redis.flushall()
    worker.heartbeat().beat()
    assert float(queue.redis.hget(queue.keys.classes, "sim")) == 75


def test_holdings_a_show_could_not_send_are_sent_whole_at_the_next_beat() -> None:
    """A load or an eviction whose report met an outage (Executor.publish goes on with the
    task): the next beat puts the holders sets right, the held model in, the evicted out."""
    queue, worker, _, (fields, res, running) = claimed()
    assert worker.executor.execute(fields, res, running) is not None  # loads m
    presence, holders = worker.presence, queue.keys.holders
    queue.redis.srem(holders("m"), "w")  # as if the load's report had not gone through
    queue.redis.sadd(holders("gone"), "w")  # evicted while Redis was away: still listed
    real = presence.pipeline

    class Down:
        def __getattr__(self, name: str) -> Any:
            if name == "execute":
                def fail() -> None:
                    raise redis.ConnectionError("down")
                return fail
            return lambda *a, **k: None

    presence.pipeline = lambda: Down()  # type: ignore[assignment,method-assign,return-value]
    with pytest.raises(redis.ConnectionError):
        presence.show(worker.cache, dropped=["gone"])
    presence.pipeline = real  # type: ignore[method-assign]
    assert presence.unsent == {"gone"}
    worker.heartbeat().beat()
    assert presence.unsent is None
    assert queue.redis.sismember(holders("m"), "w") and not queue.redis.sismember(holders("gone"), "w")


def test_a_stopped_run_does_not_make_the_same_tasks_next_run_on_this_worker_lost(
        caplog: pytest.LogCaptureFixture) -> None:
    """Regression: a run stopped past its yield deadline sends no ack, so its (task, token)
    stayed among the runs whose leases the beat renews until a beat found it gone; the same
    worker claiming the task again before that beat sent both tokens, heartbeat.lua named
    the task lost (for the old one) and the beat flagged the new run lost: stopped after the
    grace, nothing requeued it and its lease was renewed for ever (stuck running)."""
    queue, worker, task, (fields, res, running) = claimed()
    control = worker.heartbeat().control
    asked_to_yield(queue, task.id)
    control.on_yield(task.id, 0)
    control.watch()  # past its deadline: stopped and requeued
    assert running.stopped and queue.record(task.id).state.value == "queued"
    assert worker.executor.execute(fields, res, running) is None  # its result is moot
    got = worker.claim(None)  # the same worker takes the task again, before the next beat
    assert isinstance(got, tuple)
    fields2, res2, again = got[0]
    assert again.task_id == task.id and again.token != running.token
    with caplog.at_level(logging.WARNING):
        worker.heartbeat().beat()
    assert not again.ctx.lost and "lease.lost" not in caplog.text
    ack = worker.executor.execute(fields2, res2, again)
    assert ack is not None
    worker.settle([ack])
    assert task.status().value == "succeeded"
    assert worker.running.settling() == []


def test_a_task_claimed_again_while_its_old_run_still_runs_supersedes_that_run() -> None:
    """Regression: an operator's requeue of a running task let the same worker (a free slot)
    claim it again while the old run still ran. The set keyed by task id dropped the old run
    unseen (never told its lease was gone: it ran to its end on the GPU), and that run's end
    untracked the new one: the worker showed idle, took more tasks than its slots, and could
    not stop or preempt the new run."""
    queue, worker, task, (fields, res, old) = claimed(concurrency=2)
    queue.requeue(task.id)
    again = worker.claim(None)
    assert isinstance(again, tuple)
    fields2, res2, new = again[0]
    assert new.task_id == old.task_id and new.token != old.token
    assert old.ctx.should_stop() and not new.ctx.should_stop()
    assert worker.executor.execute(fields, res, old) is None  # the old run ends: moot
    assert worker.running.snapshot() == [new] and worker.running.slots_used() == 1
    worker.heartbeat().beat()
    assert not new.ctx.lost
    ack = worker.executor.execute(fields2, res2, new)
    assert ack is not None
    worker.settle([ack])
    assert task.status().value == "succeeded" and worker.running.settling() == []



def test_a_superseded_run_s_result_is_logged_discarded(caplog: pytest.LogCaptureFixture) -> None:
    """Regression: a run whose handler returned a result after the task was claimed again by
    the same worker (its run superseded, so stopped) sent no ack and logged nothing, so the
    chaos soak's run-log witness (scripts/chaos/collect.py REJECTED) could not tell its
    result from one written twice."""
    import sys
    from pathlib import Path

    from gpuq.app import App

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    from chaos.collect import REJECTED

    own = App("own")
    claims: list[Any] = []

    @own.any_model()
    def load(name: str) -> str:
        return name

    @own.handler("own.rerun")
    def rerun(model: str, payload: Any, ctx: Context) -> dict[str, int]:
        queue.requeue(ctx.task_id)  # an operator takes it back; this worker claims it again
        claims.append(worker.claim(None))
        assert ctx.should_stop()
        return {"done": 1}

    client = fakeredis.FakeRedis(decode_responses=True)
    config = Config(pool="hb", concurrency=2).validate()
    queue = Queue(client, config)
    worker = Worker(client, config, own, GpuInfo("sim", "x", 80, None, "declared"), worker_id="w")
    worker.presence.register(worker_record.identity("w", worker.gpu, 5, 2, "0123", "h", 1), 30_000)
    task = queue.enqueue("own.rerun", 1, model="m", vram_gb=1)
    first = worker.claim(None)
    assert isinstance(first, tuple)
    fields, res, old = first[0]
    with caplog.at_level(logging.WARNING, logger="gpuq.worker.executor"):
        assert worker.executor.execute(fields, res, old) is None  # its result is moot
    assert isinstance(claims[0], tuple) and claims[0][0][2].token != old.token
    assert REJECTED.findall(caplog.text) == [(task.id, "w")]


def test_a_superseded_run_that_will_not_stop_holds_its_slot_and_makes_the_worker_exit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a run stopped past its yield deadline whose task this worker claimed
    again left the running set, so its stop deadline was never checked: a handler stuck in
    native code kept the GPU alongside the new run, its slot free for a third task. It holds
    its slot and, past stop_s, makes the worker exit as any handler that will not stop."""
    queue, worker, task, (_, _, old) = claimed(concurrency=2)
    control = worker.heartbeat().control
    asked_to_yield(queue, task.id)
    control.on_yield(task.id, 0)
    old.enter()  # in its handler, stuck in native code: the stop reaches no thread
    old.thread_id = 0
    control.watch()  # past its deadline: stopped and requeued
    assert old.stopped and old.stop_deadline is not None
    got = worker.claim(None)  # the free slot takes the task again
    assert isinstance(got, tuple) and got[0][2].token != old.token
    assert worker.running.slots_used() == 2
    stuck: list[str] = []
    monkeypatch.setattr(control, "exit_stuck", lambda r: stuck.append(r.task_id))
    old.stop_deadline = 0.0
    control.watch()
    assert stuck == [task.id]


def test_a_revived_worker_still_lists_the_models_its_claims_skip() -> None:
    """Regression: a worker the reaper took for dead publishes its lane again when its beat
    finds it revived (Presence.restore); that rewrite listed its levels alone, dropping the
    models its claims skip (gpuq.worker.broken), which a runner's claim had listed as it put
    the worker back in `idle`: until its next claim, offers of those models went to it."""
    client = fakeredis.FakeRedis(decode_responses=True)
    config = Config(pool="hb").validate()
    queue = Queue(client, config)
    worker = Worker(client, config, app, GpuInfo("sim", "x", 80, None, "declared"), worker_id="w")
    worker.presence.register(worker_record.identity("w", worker.gpu, 5, 1, "0123", "h", 1), 30_000)
    worker.executor.broken.failed("m")  # its load of m failed: skipped 30 s
    assert not isinstance(worker.claim(None), tuple)  # nothing queued: listed idle, and m skipped
    lanes = queue.keys.lanes
    assert set(worker_record.lane_skips(client.hget(lanes, "w"), server_ms(client))) == {"m"}
    client.zrem(queue.keys.workers, "w")  # the reaper took it for dead after that claim
    worker.heartbeat().beat()  # revived: restored
    assert set(worker_record.lane_skips(client.hget(lanes, "w"), server_ms(client))) == {"m"}
    assert client.zscore(queue.keys.idle, "w") is not None
    task = queue.enqueue("sim.noop", 1, model="m", vram_gb=1)
    assert queue.record(task.id).offered is None  # not offered to the only idle worker: it skips m
    other = queue.enqueue("sim.noop", 1, model="n", vram_gb=1)
    assert queue.record(other.id).offered == "w"
