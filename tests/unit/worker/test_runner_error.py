"""A runner's unexpected error (gpuq.worker.loop.Worker.runner, Executor.abandon), on fakeredis:
the runs the runner took end and free their slots; nothing is left running with its lease
renewed for good."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

from gpuq import Config, Queue, worker_record
from gpuq.app import App, BatchContext, Context
from gpuq.task import State
from gpuq.worker import batch, loop
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.loop import Worker


def app() -> App:
    app = App("runner-error")
    app.any_model()(lambda name: name)

    @app.handler("one")
    def one(model: Any, payload: Any, ctx: Context) -> Any:
        return payload

    @app.handler("many", batch=2)
    def many(model: Any, payloads: list[Any], ctx: BatchContext) -> list[Any]:
        return payloads

    return app


def worker_with(handler: str, tasks: int) -> tuple[Queue, Worker, list[str]]:
    client = fakeredis.FakeRedis(decode_responses=True)
    config = Config(pool="re").validate()
    queue = Queue(client, config)
    worker = Worker(client, config, app(), GpuInfo("sim", "x", 80, None, "declared"), worker_id="w")
    worker.presence.register(worker_record.identity("w", worker.gpu, 5, 1, "0123", "h", 1), 30_000)
    ids = [queue.enqueue(handler, i, model="m", vram_gb=2, max_attempts=2).id for i in range(tasks)]
    return queue, worker, ids


def boom(worker: Worker) -> Any:
    """An unexpected error that stops the worker as it escapes: the runner's loop then ends
    after the error is handled, and sends what it has left."""

    def raise_it(*args: Any, **kw: Any) -> Any:
        worker.stopping.set()
        raise RuntimeError("boom")

    return raise_it


def assert_ended(queue: Queue, worker: Worker, ids: list[str]) -> None:
    for task_id in ids:
        record = queue.record(task_id)
        assert record.state != State.RUNNING, task_id
        assert record.error == "RuntimeError: boom"
    assert len(worker.running) == 0 and worker.running.slots_used() == 0
    assert worker.running.settling() == []  # no lease renewed any more
    assert worker.cache.working_gb == 0


def test_an_error_after_the_claim_fails_the_claimed_task_and_frees_its_slot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim tracked the task (its lease renewed by the heartbeat); an error before it
    ran left it tracked: `running` for good, its slot lost."""
    queue, worker, ids = worker_with("one", 1)
    monkeypatch.setattr(loop.batch, "execute", boom(worker))
    worker.runner()
    assert_ended(queue, worker, ids)


def test_an_error_after_a_batch_ended_fails_its_tasks_whose_ends_were_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch's runs were untracked (their leases renewed until their ends are answered)
    and the error dropped the ends built for them: every task stayed `running` for good."""
    queue, worker, ids = worker_with("many", 2)
    monkeypatch.setattr(batch, "results_of", boom(worker))
    worker.runner()
    assert_ended(queue, worker, ids)


def test_an_error_settling_one_end_keeps_the_claim_sent_with_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An error reading an ack's reply (here: counting its outcome) escaped the claim that
    carried the ack: the task that claim took was never begun (left to its lease's expiry)
    and the sent ack stayed unsent to the runner, which sent it again."""
    queue, worker, ids = worker_with("one", 2)
    first = worker.claim(None)
    assert isinstance(first, tuple)
    ack = worker.executor.execute(*first[0])
    assert ack is not None and ack.script == "ack"
    observe = worker.executor.observer.observe

    def observe_but_succeeded(task_id: str, outcome: str | None = None, **kw: Any) -> None:
        if outcome == "succeeded":
            raise RuntimeError("boom")
        observe(task_id, outcome, **kw)

    monkeypatch.setattr(worker.executor.observer, "observe", observe_but_succeeded)
    second = worker.claim([ack])
    assert isinstance(second, tuple) and second[0][2].task_id == ids[1]
    assert [r.task_id for r in worker.running.snapshot()] == [ids[1]]
    assert worker.running.settling() == []
    assert queue.record(ids[0]).state == State.SUCCEEDED
