"""gpuq.worker.batch on fakeredis: a batch's tasks are claimed together, run in one handler
call and settled one by one (drain runs the same code as a worker)."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest
import redis

from gpuq.app import App, BatchContext
from gpuq.client import Queue
from gpuq.errors import GpuqError, TaskError
from gpuq.scripts import Call, ClaimRequest
from gpuq.task import MAX_RESULT_BYTES, State
from gpuq.testing import drain, memory_queue
from gpuq.worker import batch, outcome
from gpuq.worker.executor import Executor
from gpuq.worker.models import ModelCache
from gpuq.worker.observer import Observer
from gpuq.worker.presence import Presence
from gpuq.worker.running import RunningSet
from gpuq.worker.runtimes import RunTimes


def enqueue(q: Queue, handler: str, n: int, **options: Any) -> list[str]:
    return [q.enqueue(handler, i, model="bge", vram_gb=3, **options).id for i in range(n)]


def executor(q: Queue, app: App) -> Executor:
    cache = ModelCache(app, 40, q.config.kv_reserve_gb)
    return Executor(app, cache, Presence(q.redis, q.keys, "w"), RunningSet(), q.scripts, q.calls,
                    Observer(), RunTimes())


def batch_calls(q: Queue, ex: Executor) -> list[Call[Any]]:
    """Claim one task and run the batch it starts; the calls it would send."""
    req = ClaimRequest("w", ex.cache.free_gb(), ex.cache.evictable_gb(), 1, ex.cache.loaded(),
                       batches=batch.wanted(ex.app))
    claim = q.scripts.run(q.calls.claim(req))
    assert claim.task is not None
    with ex.cache.lock:
        claimed = (claim.task, *ex.begin(claim.task))
        added = batch.begin_added(ex, claim.batch)
    return batch.execute(ex, claimed, added=added)


def run_one_batch(q: Queue, ex: Executor) -> list[str]:
    """Claim one task, run the batch it starts, send its calls; the scripts called."""
    calls = batch_calls(q, ex)
    for call in calls:
        ex.settle(call, q.scripts.run_raw(call))
    assert len(ex.running) == 0 and ex.running.slots_used() == 0 and ex.cache.working_gb == 0
    return [c.script for c in calls]


def app_with(fn: Any, size: int = 4) -> App:
    app = App("t")
    app.model("bge", vram_gb=2)(lambda name: name)
    app.handler("h", model="bge", batch=size)(fn)
    return app


def test_one_call_runs_the_batch_and_each_task_is_acked_with_its_result() -> None:
    q = memory_queue()
    seen: list[list[Any]] = []

    def handler(model: str, payloads: list[Any], ctx: BatchContext) -> list[Any]:
        seen.append(payloads)
        return [{"p": p, "id": c.task_id} for p, c in zip(payloads, ctx.contexts)]

    ids = enqueue(q, "h", 6)
    assert drain(q, app_with(handler)) == 6
    assert seen == [[0, 1, 2, 3], [4, 5]]
    for i, tid in enumerate(ids):
        assert q.record(tid).result == {"p": i, "id": tid}


def test_an_exception_fails_each_task_as_one_task_would() -> None:
    q = memory_queue()

    def boom(model: str, payloads: list[Any], ctx: BatchContext) -> list[Any]:
        raise ValueError("no")

    ids = enqueue(q, "h", 3)
    ex = executor(q, app_with(boom))
    assert run_one_batch(q, ex) == ["fail"] * 3
    for tid in ids:
        r = q.record(tid)
        assert (r.state, r.error, r.attempt) == (State.DELAYED, "ValueError: no", 1)


@pytest.mark.parametrize("result, got", [([1], "1 results"), ({"a": 1}, "a dict, not a list,"),
                                         (None, "a NoneType, not a list,")])
def test_a_wrong_count_or_a_non_list_fails_every_task_with_the_reason(result: Any, got: str) -> None:
    q = memory_queue()
    ids = enqueue(q, "h", 3, max_attempts=1)
    assert drain(q, app_with(lambda model, payloads, ctx: result)) == 3
    for tid in ids:
        r = q.record(tid)
        assert (r.state, r.error) == (State.FAILED, f"batch handler 'h' returned {got} for 3 tasks")


def test_a_result_that_cannot_be_stored_fails_that_task_alone() -> None:
    q = memory_queue()
    ids = enqueue(q, "h", 3)
    drain(q, app_with(lambda model, payloads, ctx: [1, math.nan, 3]))
    states = [q.record(t).state for t in ids]
    assert states == [State.SUCCEEDED, State.FAILED, State.SUCCEEDED]
    assert "not JSON" in (q.record(ids[1]).error or "")


@pytest.mark.parametrize("asked_by", ["planner", "shutdown"])
def test_a_yield_gives_every_task_back_without_using_an_attempt(asked_by: str) -> None:
    """A yield the worker's shutdown asked for gives the tasks back as its give-back does:
    not counted as a preemption (preempt_max), said as a shutdown."""
    q = memory_queue()
    ids = enqueue(q, "h", 3)

    def yields(model: str, payloads: list[Any], ctx: BatchContext) -> list[Any]:
        for r in ex.running.snapshot():  # as the planner's yield, or the shutdown's, marks them
            r.ctx.yield_requested, r.leaving = True, asked_by == "shutdown"
        ctx.contexts[0].save_checkpoint({"done": 1})
        ctx.yield_now()

    ex = executor(q, app_with(yields))
    assert run_one_batch(q, ex) == ["requeue"] * 3
    for tid in ids:
        r = q.record(tid)
        assert (r.state, r.attempt) == (State.QUEUED, 0)
        assert (r.preemptions, r.error) == ((0, "worker shut down") if asked_by == "shutdown"
                                            else (1, "yielded to a higher-priority task"))
    assert q.redis.hget(q.keys.task(ids[0]), "checkpoint") == '{"done":1}'


def test_a_batch_handler_catching_its_yield_gives_way_all_the_same() -> None:
    """As a single handler: a batch handler whose ``except Exception`` caught its own
    yield_now and returned results (or raised another error) gives every task back."""
    for ends in ("returns", "raises"):
        q = memory_queue()
        ids = enqueue(q, "h", 3)

        def catches(model: str, payloads: list[Any], ctx: BatchContext) -> list[Any]:
            for r in ex.running.snapshot():
                r.ctx.yield_requested = True
            try:
                ctx.yield_now()
            except BaseException:  # noqa: BLE001 - the mistake under test
                if ends == "raises":
                    raise RuntimeError("after the yield") from None
            return payloads

        ex = executor(q, app_with(catches))
        assert run_one_batch(q, ex) == ["requeue"] * 3, ends
        assert [(q.record(t).state, q.record(t).attempt) for t in ids] == [(State.QUEUED, 0)] * 3


def test_the_learned_time_of_a_batched_task_is_its_share_of_the_batch() -> None:
    q = memory_queue()
    enqueue(q, "h", 4)
    ex = executor(q, app_with(lambda model, payloads, ctx: payloads))
    run_one_batch(q, ex)
    runs = ex.runtimes.take()
    assert len(runs) == 4 and all(r[:2] == ("h", "bge") for r in runs)
    assert len({r[2] for r in runs}) == 1


def test_a_single_task_handler_is_not_batched() -> None:
    q = memory_queue()
    app = App("t")
    app.model("bge", vram_gb=2)(lambda name: name)
    app.handler("h", model="bge")(lambda model, payload, ctx: payload)
    enqueue(q, "h", 3)
    ex = executor(q, app)
    assert run_one_batch(q, ex) == ["ack"]


def test_a_batch_shares_one_slot_and_reserves_each_task_s_working_memory() -> None:
    q = memory_queue()
    enqueue(q, "h", 3)
    app = app_with(lambda model, payloads, ctx: payloads)
    ex = executor(q, app)
    fields = q.scripts.run(q.calls.claim(ClaimRequest("w", ex.cache.free_gb(), 0, 1))).task
    assert fields is not None
    with ex.cache.lock:
        claimed = (fields, *ex.begin(fields))
    items = batch.fill(ex, app.handlers["h"], claimed, None)
    assert len(items) == 3 and len(ex.running) == 3 and ex.running.slots_used() == 1
    assert ex.cache.working_gb == 3  # 1 GB each beside the 2 GB model
    assert [c.script for c in batch.run(ex, app.handlers["h"], items)] == ["ack"] * 3
    assert len(ex.running) == 0 and ex.cache.working_gb == 0


def test_a_warm_claim_brings_its_batch_and_claim_batch_is_not_called() -> None:
    q = memory_queue()
    seen: list[list[Any]] = []

    def handler(model: str, payloads: list[Any], ctx: BatchContext) -> list[Any]:
        seen.append(payloads)
        return payloads

    enqueue(q, "h", 9)
    ex = executor(q, app_with(handler))
    ex.scripts.run = counting = Counting(ex.scripts.run)  # type: ignore[method-assign]
    run_one_batch(q, ex)  # cold: the claim leaves the batch to claim_batch, after the load
    assert counting.scripts == ["claim", "claim_batch"]
    counting.scripts.clear()
    run_one_batch(q, ex)  # warm: the claim took the batch
    assert counting.scripts == ["claim"]
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("error", [redis.ConnectionError("Connection reset by peer"),
                                   redis.ReadOnlyError("You can't write against a read only replica."),
                                   GpuqError("claim_batch: unexpected reply")])
def test_a_failed_claim_batch_runs_the_batch_as_it_is(error: Exception) -> None:
    """Regression: a Redis error from claim_batch (cold: it runs right after the claim) left
    batch.execute before run, so the first task's memory, model placeholder and slot were
    never given back: the worker never claimed again and its lease was renewed forever."""
    q = memory_queue()
    enqueue(q, "h", 3)
    ex = executor(q, app_with(lambda model, payloads, ctx: payloads))
    real = ex.scripts.run

    def failing(call: Any) -> Any:
        if call.script == "claim_batch":
            raise error
        return real(call)

    ex.scripts.run = failing  # type: ignore[method-assign]
    assert run_one_batch(q, ex) == ["ack"]  # the first task alone; the ledger and slot whole
    assert ex.cache.model_names() == ["bge"]


class Counting:
    """Scripts.run, counting the scripts it runs."""

    def __init__(self, run: Any) -> None:
        self.run, self.scripts = run, []  # type: list[str]

    def __call__(self, call: Any) -> Any:
        self.scripts.append(call.script)
        return self.run(call)


@pytest.mark.parametrize("wait_ms, ran", [(0, [[9]]), (5, [[9, 10, 11, 12]])])
def test_a_task_handed_to_a_holder_starts_alone_unless_its_handler_waits(wait_ms: int,
                                                                         ran: list[Any]) -> None:
    q = memory_queue()
    seen: list[list[Any]] = []

    def handler(model: str, payloads: list[Any], ctx: BatchContext) -> list[Any]:
        seen.append(payloads)
        return payloads

    app = App("t")
    app.model("bge", vram_gb=2)(lambda name: name)
    app.handler("h", model="bge", batch=4, batch_wait_ms=wait_ms)(handler)
    ex = executor(q, app)
    enqueue(q, "h", 1)
    run_one_batch(q, ex)  # loads the model
    seen.clear()
    ids = [q.enqueue("h", i, model="bge", vram_gb=3).id for i in range(9, 13)]
    req = ClaimRequest("w", ex.cache.free_gb(), ex.cache.evictable_gb(), 1, ex.cache.loaded())
    fields = q.scripts.run(q.calls.claim(req)).task  # as enqueue would hand it over: alone
    assert fields is not None and fields["id"] == ids[0]
    with ex.cache.lock:
        claimed = (fields, *ex.begin(fields))
    for call in batch.execute(ex, claimed, threading.Event(), handed=True):
        ex.settle(call, q.scripts.run_raw(call))
    assert seen == ran
    assert [q.record(t).state for t in ids[len(ran[0]):]] == [State.QUEUED] * (4 - len(ran[0]))


@pytest.mark.parametrize("cut", ["reserved", "yield", "stop"])
def test_a_reservation_a_yield_or_a_stop_ends_the_batch_wait(cut: str) -> None:
    """Regression: a lone P3 batch task waited out its batch_wait_ms (8 s) holding the
    worker's only slot, while the planner had reserved the worker for a waiting P0 task
    (or asked the task to yield): the P0 started 7.9 s late."""
    q = memory_queue()
    app = App("t")
    app.model("bge", vram_gb=2)(lambda name: name)
    app.handler("h", model="bge", batch=8, batch_wait_ms=8000)(lambda model, payloads, ctx: payloads)
    ex = executor(q, app)
    enqueue(q, "h", 1)
    run_one_batch(q, ex)  # loads the model
    tid = q.enqueue("h", 1, model="bge", vram_gb=3, priority="P3").id
    req = ClaimRequest("w", ex.cache.free_gb(), ex.cache.evictable_gb(), 1, ex.cache.loaded(),
                       batches=batch.wanted(app))
    claim = q.scripts.run(q.calls.claim(req))
    assert claim.task is not None and claim.task["id"] == tid
    stopping = threading.Event()
    with ex.cache.lock:
        claimed = (claim.task, *ex.begin(claim.task))
        added = batch.begin_added(ex, claim.batch)
    running = claimed[2]

    def interrupt() -> None:
        if cut == "reserved":
            ex.running.nudge(reserved=True)  # as Control does on "reserved <task>"
        elif cut == "yield":
            running.ctx.yield_requested = True
            ex.running.nudge()
        else:
            stopping.set()
            ex.running.nudge()

    timer = threading.Timer(0.2, interrupt)
    timer.start()
    started = time.monotonic()
    items = batch.fill(ex, app.handlers["h"], claimed, stopping, added)
    assert time.monotonic() - started < 3  # not the 8 s wait
    assert [i[2].task_id for i in items] == [tid]
    timer.join()


def test_a_batchs_tasks_stopped_for_a_lost_lease_are_counted_lost(caplog: pytest.LogCaptureFixture) -> None:
    """Found by a QA pass: a run stopped past the grace after its task was canceled was
    counted under no outcome in gpuq_worker_tasks_total; a batch's were left out too."""
    from gpuq.metrics import WorkerMetrics

    q = memory_queue()
    ex: Executor

    def handler(model: str, payloads: list[Any], ctx: BatchContext) -> list[Any]:
        for run in ex.running.snapshot():  # both canceled, the worker stopped them
            run.ctx.lost = run.stopped = True
        return payloads

    ex = executor(q, app_with(handler))
    ex.observer.metrics = WorkerMetrics("p", "w", "A100")
    enqueue(q, "h", 2)
    with caplog.at_level("WARNING", logger="gpuq.worker.batch"):
        assert run_one_batch(q, ex) == []  # nothing to send for runs no longer the worker's
    assert caplog.text.count("result discarded (its run was stopped)") == 2
    lost = ex.observer.metrics.registry.get_sample_value(
        "gpuq_worker_tasks_total", {"pool": "p", "gpu": "w", "priority": "P2", "outcome": "lost"})
    assert lost == 2


@pytest.mark.parametrize("ends", ["raises", "yields"])
def test_a_batchs_canceled_task_sends_no_failure_or_yield(ends: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """As a single task's (Executor.lost): the failure or yield of a batch's task canceled
    while it ran is moot, not sent for the server to refuse, and counted lost."""
    from gpuq.metrics import WorkerMetrics

    q = memory_queue()
    ex: Executor

    def handler(model: str, payloads: list[Any], ctx: BatchContext) -> list[Any]:
        ctx.contexts[0].lost = True  # canceled while the batch ran
        if ends == "yields":
            ex.running.snapshot()[1].ctx.yield_requested = True
            ctx.yield_now()
        raise ValueError("no")

    ex = executor(q, app_with(handler))
    ex.observer.metrics = WorkerMetrics("p", "w", "A100")
    ids = enqueue(q, "h", 2)
    with caplog.at_level("INFO"):
        calls = batch_calls(q, ex)
    assert [(c.script, c.args[0]) for c in calls] == [("fail" if ends == "raises" else "requeue", ids[1])]
    what = "failure" if ends == "raises" else "yield"
    assert f"lease.lost task={ids[0]} worker=w: {what} not sent" in caplog.text
    lost = ex.observer.metrics.registry.get_sample_value(
        "gpuq_worker_tasks_total", {"pool": "p", "gpu": "w", "priority": "P2", "outcome": "lost"})
    assert lost == 1


def test_an_exception_in_a_tasks_place_fails_that_task_alone() -> None:
    """Regression: an exception returned for one task of the batch (the way to fail part of
    a batch) failed it for good as "a result that is not JSON", whatever its retry said."""
    q = memory_queue()
    ids = enqueue(q, "h", 4, max_attempts=2)

    def half(model: str, payloads: list[Any], ctx: BatchContext) -> list[Any]:
        return [p if p % 2 == 0 else TaskError("odd\ninput", retry=p == 1) for p in payloads]

    ex = executor(q, app_with(half))
    assert run_one_batch(q, ex) == ["ack", "fail", "ack", "fail"]
    got = [(r.state, r.error, r.result) for r in map(q.record, ids)]
    assert got == [(State.SUCCEEDED, None, 0), (State.DELAYED, "odd input", None),
                   (State.SUCCEEDED, None, 2), (State.FAILED, "odd input", None)]


def test_a_result_nested_too_deep_to_encode_fails_that_task_alone() -> None:
    """Regression: the RecursionError of encoding one task's result escaped the batch after
    its runs ended, dropping the acks of the others: every task stayed `running`."""
    q = memory_queue()
    ids = enqueue(q, "h", 2, max_attempts=2)
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]

    def one_deep(model: str, payloads: list[Any], ctx: BatchContext) -> list[Any]:
        return [deep if p == 1 else p for p in payloads]

    assert run_one_batch(q, executor(q, app_with(one_deep))) == ["ack", "fail"]
    first, second = map(q.record, ids)
    assert first.state == State.SUCCEEDED and first.result == 0
    assert second.state == State.FAILED and "not JSON" in (second.error or "")


@pytest.mark.parametrize("value", [{"i": 1}, [1, 2.5, None, True], "text", 7, {"b": [{"c": "é"}]}])
def test_a_batchs_encoder_writes_what_encode_writes(value: Any) -> None:
    assert outcome.batch_encode()(value) == outcome.encode(value)
    assert outcome.kept_encode(value) == outcome.encode(value)  # a runner's, kept by its thread


def test_a_runners_kept_encoder_after_a_result_it_refused_encodes_the_next() -> None:
    result = {"a": {1}}
    with pytest.raises(TaskError, match="not JSON"):
        outcome.kept_encode(result)
    result["a"] = 1  # type: ignore[assignment]
    assert outcome.kept_encode(result) == '{"a":1}'


def test_a_batchs_encoder_after_a_result_it_refused_encodes_the_next() -> None:
    """A result the C encoder refuses midway leaves its containers marked: the same dict,
    mended by the handler, is still encoded, not refused as circular."""
    enc, result = outcome.batch_encode(), {"a": {1}}
    with pytest.raises(TaskError, match="not JSON"):
        enc(result)
    result["a"] = 1  # type: ignore[assignment]
    assert enc(result) == '{"a":1}'
    with pytest.raises(TaskError, match="bytes, more than"):
        enc(["x" * MAX_RESULT_BYTES])


def test_a_batch_s_acks_settle_together_each_on_its_own_reply() -> None:
    q = memory_queue()
    ids = enqueue(q, "h", 4)
    ex = executor(q, app_with(lambda model, payloads, ctx: payloads))
    calls = batch_calls(q, ex)
    assert [c.script for c in calls] == ["ack"] * 4 and len(ex.running.settling()) == 4
    q.cancel(ids[1])  # its ack is refused: the task is not running under its token
    batch.settle_all(ex, calls, q.scripts.pipelined(calls))
    assert ex.running.settling() == [] and ex.unacked == {}  # none renewed any more
    assert [q.record(t).state for t in ids] == [State.SUCCEEDED, State.CANCELED, State.SUCCEEDED,
                                                State.SUCCEEDED]
    assert len(ex.runtimes.take()) == 3  # the acked runs alone are learned


@pytest.mark.parametrize("canceled", [False, True])
def test_a_runner_s_one_ack_settles_on_its_reply(canceled: bool) -> None:
    """A single task's ack (a runner's every task) settles as a batch's: an OK reply ends
    its renewals and keeps its run time; a refused one is said, and learns nothing."""
    app = App("t")
    app.model("bge", vram_gb=2)(lambda name: name)
    app.handler("one", model="bge")(lambda model, payload, ctx: payload)
    q = memory_queue()
    task_id, = enqueue(q, "one", 1)
    ex = executor(q, app)
    calls = batch_calls(q, ex)
    assert [c.script for c in calls] == ["ack"] and ex.running.settling() != []
    if canceled:
        q.cancel(task_id)
    batch.settle_all(ex, calls, q.scripts.pipelined(calls))
    assert ex.running.settling() == [] and ex.unacked == {}
    assert q.record(task_id).state == (State.CANCELED if canceled else State.SUCCEEDED)
    assert len(ex.runtimes.take()) == (0 if canceled else 1)


def test_a_handler_registered_with_batch_1_gets_a_list_of_one() -> None:
    """Found by a QA pass: batch=1 (a size read from settings) silently made the handler a
    one-payload handler: written for lists, it failed each task with a TypeError."""
    q = memory_queue()
    ids = enqueue(q, "h", 2)
    seen: list[Any] = []

    def handler(model: str, payloads: list[Any], ctx: BatchContext) -> list[Any]:
        seen.append(payloads)
        return [p * 10 for p in payloads]

    assert drain(q, app_with(handler, size=1)) == 2
    assert seen == [[0], [1]]
    assert [q.record(t).result for t in ids] == [0, 10]
