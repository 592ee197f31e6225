"""The executor's own checks on a task's outcome (gpuq.worker.executor.Executor), run on a
worker built over fakeredis without starting it: the call it returns is what the runner sends."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import fakeredis
import pytest
import redis

from gpuq import Config, Queue, metrics
from gpuq.app import App, Context
from gpuq.errors import TaskError
from gpuq.task import MAX_RESULT_BYTES
from gpuq.worker import executor
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.loop import Worker
from gpuq.worker.models import Reservation
from gpuq.worker.running import Running


def run_once(result_size: int, **damage: str | None) -> tuple[str, list[str]]:
    """Claim and run one "big" task returning ``result_size`` bytes of JSON; ``damage``
    overwrites (or, with None, removes) fields as a damaged task hash would."""
    app = App("executor-test")
    app.any_model()(lambda name: name)

    @app.handler("big")
    def big(model: Any, payload: Any, ctx: Context) -> str:
        return "x" * payload

    worker = Worker(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"), app,
                    GpuInfo("L4", "uuid", 24, None, "declared"), worker_id="w")
    fields = {"id": "t1", "handler": "big", "model": "m", "payload": str(result_size),
              "vram_gb": "4", "attempt": "1", "est_s": "1", "token": "7"}
    for name, value in damage.items():
        if value is None:
            del fields[name]
        else:
            fields[name] = value
    with worker.cache.lock:
        res, running = worker.executor.begin(fields)
    assert isinstance(running, Running)
    call = worker.executor.execute(fields, res, running)
    assert call is not None
    # nothing stays reserved; a model stays loaded only if the handler ran
    assert worker.cache.working_gb == 0
    assert worker.cache.free_gb() == (19 if running.rejected else 15)
    return call.script, call.args


def test_a_result_past_the_limit_fails_the_task_without_retry() -> None:
    """The ack script refuses a result past the limit; the worker says why in the task's
    error instead of sending an ack that would be refused and letting the lease run out."""
    script, args = run_once(MAX_RESULT_BYTES)  # two quotes make it 2 bytes too long
    assert script == "fail"
    assert f"more than the {MAX_RESULT_BYTES} allowed" in args[3] and args[4] == "0"
    script, args = run_once(MAX_RESULT_BYTES - 2)
    assert script == "ack" and len(args[3]) == MAX_RESULT_BYTES


def test_a_damaged_task_hash_fails_that_task_with_the_reason() -> None:
    for damage in ({"vram_gb": "abc"}, {"vram_gb": "nan"}, {"vram_gb": "-1"}, {"est_s": "inf"},
                   {"attempt": "x"}, {"handler": None}, {"checkpoint": "{not json"}):
        script, args = run_once(10, **damage)
        assert (script, args[4]) == ("fail", "0"), damage
        assert args[3].startswith("task fields cannot be read:"), (damage, args[3])
    script, args = run_once(10, handler="nope.x")
    assert (script, args[3], args[4]) == ("fail", "handler 'nope.x' is not registered in app "
                                          "'executor-test'", "0")


def test_a_cold_start_reports_its_handler_start_unless_its_lease_is_gone() -> None:
    """A task claimed cold (sla "pending") is counted by began.lua just before its handler
    runs; one canceled during its load is not run, and nothing is counted for it."""
    client = fakeredis.FakeRedis(decode_responses=True)
    app = App("executor-test")
    app.any_model()(lambda name: name)
    ran: list[str] = []

    @app.handler("echo")
    def echo(model: Any, payload: Any, ctx: Context) -> str:
        ran.append(ctx.task_id)
        return "ok"

    worker = Worker(client, Config(pool="p"), app, GpuInfo("L4", "uuid", 24, None, "declared"),
                    worker_id="w")
    queue = Queue(client, Config(pool="p"))
    for model, cancel in (("a", False), ("b", True)):
        task = queue.enqueue("echo", model=model, vram_gb=4, priority="P0")
        got = worker.claim(None)
        assert isinstance(got, tuple)
        claimed = got[0]
        fields, res, running = claimed
        assert fields["id"] == task.id and fields["sla"] == "pending"
        if cancel:
            queue.cancel(task.id)
        call = worker.executor.execute(fields, res, running)
        assert (call is None) is cancel and (task.id in ran) is not cancel
    stats = client.hgetall(queue.keys.stats)
    assert int(stats.get("sla_met:P0", 0)) + int(stats.get("sla_missed:P0", 0)) == 1


def test_a_handler_that_raises_counts_its_run_time() -> None:
    """Regression: the run phase was observed only for a handler that returned, so the
    queue/load/run split left out the GPU time of failing runs."""
    from gpuq.metrics import WorkerMetrics

    app = App("executor-test")
    app.any_model()(lambda name: name)

    @app.handler("boom")
    def boom(model: Any, payload: Any, ctx: Context) -> None:
        raise ValueError("no")

    worker = Worker(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"), app,
                    GpuInfo("L4", "uuid", 24, None, "declared"), worker_id="w")
    worker.observer.metrics = metrics = WorkerMetrics("p", "w", "L4")
    fields = {"id": "t1", "handler": "boom", "model": "m", "payload": "1", "vram_gb": "4",
              "attempt": "1", "est_s": "1", "token": "7", "priority": "2", "started_at": "1000",
              "queued_at": "900", "enqueued_at": "900", "sla": "met"}
    with worker.cache.lock:
        res, running = worker.executor.begin(fields)
    call = worker.executor.execute(fields, res, running)
    assert call is not None and call.script == "fail"
    assert metrics.registry.get_sample_value(
        "gpuq_task_phase_seconds_count", {"pool": "p", "priority": "P2", "phase": "run"}) == 1


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of it raised")


def test_a_failure_is_one_line_even_when_its_exception_cannot_be_printed() -> None:
    """Regression: an exception whose str() raised escaped the runner with no fail sent; the
    heartbeat renews a run's lease until its fail is answered, so the task stayed running
    for good. A message of several lines went into the worker's log as several lines."""
    app = App("executor-test")
    app.any_model()(lambda name: name)
    raised: list[BaseException] = [Unprintable(), ValueError("first\r\nsecond\n"), RuntimeError(),
                                   TaskError("bad\ninput", retry=False)]

    @app.handler("boom")
    def boom(model: Any, payload: Any, ctx: Context) -> None:
        raise raised[payload]

    worker = Worker(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"), app,
                    GpuInfo("L4", "uuid", 24, None, "declared"), worker_id="w")
    errors = []
    for i in range(len(raised)):
        fields = {"id": f"t{i}", "handler": "boom", "model": "m", "payload": str(i),
                  "vram_gb": "4", "attempt": "1", "est_s": "1", "token": "7"}
        with worker.cache.lock:
            res, running = worker.executor.begin(fields)
        call = worker.executor.execute(fields, res, running)
        assert call is not None and call.script == "fail"
        errors.append((call.args[3], call.args[4]))
    assert errors == [("Unprintable: <exception str() failed>", "1"), ("ValueError: first second", "1"),
                      ("RuntimeError", "1"), ("bad input", "0")]


def test_an_unexpected_failure_logs_where_it_was_raised(caplog: pytest.LogCaptureFixture) -> None:
    """Regression: a failed task records one line and the worker logged only that line, so an
    operator could not find where a handler (or a model's loader) raised. A TaskError is the
    handler's own verdict and logs no traceback."""
    app = App("executor-test")

    @app.model("broken", vram_gb=1)
    def load_broken(name: str) -> None:
        raise OSError("weights missing")

    app.any_model()(lambda name: name)
    raised: list[BaseException] = [KeyError("missing"), TaskError("bad input", retry=False)]

    @app.handler("boom")
    def boom(model: Any, payload: Any, ctx: Context) -> None:
        raise raised[payload]

    worker = Worker(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"), app,
                    GpuInfo("L4", "uuid", 24, None, "declared"), worker_id="w")
    caplog.set_level(logging.INFO, logger="gpuq")
    for i, model in enumerate(["m", "m", "broken"]):
        fields = {"id": f"t{i}", "handler": "boom", "model": model, "payload": str(i % 2),
                  "vram_gb": "4", "attempt": "1", "est_s": "1", "token": "7"}
        with worker.cache.lock:
            res, running = worker.executor.begin(fields)
        call = worker.executor.execute(fields, res, running)
        assert call is not None and call.script == "fail"
    traced = {r.getMessage().split(" ")[0] + " " + r.getMessage().split(" ")[1]: r.exc_info is not None
              for r in caplog.records if r.getMessage().startswith(("task.failed", "model.load_failed"))}
    assert traced == {"task.failed task=t0": True, "task.failed task=t1": False,
                      "model.load_failed worker=w": True, "task.failed task=t2": False}


@pytest.mark.parametrize("raised", [SystemExit(1), KeyboardInterrupt()], ids=["exit", "interrupt"])
def test_a_loader_that_exits_fails_its_load(raised: BaseException) -> None:
    """Regression: a loader's sys.exit() or KeyboardInterrupt failed the task as the
    handler's error ("SystemExit: 1"): no load failure was counted, so the worker's claims
    did not pass over the model and other workers were not given its tasks."""
    app = App("exits")

    @app.model("exits", vram_gb=1)
    def load(name: str) -> None:
        raise raised

    @app.handler("h")
    def handler(model: Any, payload: Any, ctx: Context) -> None:
        return None

    worker, call = run_one(app, model="exits", task_id="t", payload="1")
    assert call is not None and call.script == "fail"
    assert f"loading model exits failed: {type(raised).__name__}" in str(call.args)
    assert worker.executor.broken.failures("exits") == 1


def test_a_warm_hand_over_tells_began_no_load_came_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """began notes a miss as cold (a load between) unless told the start was warm: a warm
    hand-over's began says so, on its own connection and, that write failing, on the
    runner's; a cold start's does not."""
    worker = Worker(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"), App("t"),
                    GpuInfo("L4", "uuid", 24, None, "declared"), worker_id="w")
    ex, sent = worker.executor, []

    def unsent(call: Any) -> Any:  # the take-up connection's write fails
        sent.append(call.args)
        raise redis.ConnectionError("down")

    monkeypatch.setattr(ex.scripts, "command", unsent)
    monkeypatch.setattr(ex.scripts, "run", lambda call: sent.append(call.args) or ("", 0))
    for cold in (False, True):
        running = Running("t1", 7, Context("t1", 1, "w", "m", 1.0, 1.0), 0.0, handed=True,
                          start_by=time.monotonic() + 60)  # popped in time
        assert ex.taken_up({"id": "t1"}, Reservation("m", 1.0, cold, ()), running)
    assert [args[3] for args in sent] == ["1", "1", "0"]


def test_every_outcome_the_worker_counts_is_the_documented_set() -> None:
    """Regression: metrics.WORKER_OUTCOMES, the outcomes of gpuq_worker_tasks_total, lacked
    `passed`, which the worker counts for a task passed to the workers that run its handler."""
    table = re.search(r"gpuq_worker_tasks_total \| counter \| [^|]*outcome \(([^)]*)\)",
                      metrics.__doc__ or "")
    assert table is not None and tuple(table[1].split(", ")) == metrics.WORKER_OUTCOMES
    counted = {*executor.SETTLED.values(), *executor.FAILED.values(), "failed", "lost", "stopped"}
    assert counted <= set(metrics.WORKER_OUTCOMES)


def run_one(app: App, *, model: str = "m", task_id: str = "t1", payload: str = "null",
            lost: bool = False) -> tuple[Worker, Any]:
    """Claim-free run of one task of handler "h" on a worker over fakeredis (with ``lost``,
    its lease gone as it starts): the worker, and the call its executor returns."""
    worker = Worker(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"), app,
                    GpuInfo("L4", "uuid", 24, None, "declared"), worker_id="w")
    fields = {"id": task_id, "handler": "h", "model": model, "payload": payload, "vram_gb": "4",
              "attempt": "1", "est_s": "1", "token": "7"}
    with worker.cache.lock:
        res, running = worker.executor.begin(fields)
    assert isinstance(running, Running)
    running.ctx.lost = lost
    return worker, worker.executor.execute(fields, res, running)


def run_yielding(handler: Any, *, lost: bool = False) -> Any:
    """Run ``handler`` on one task; the call the executor returns."""
    app = App("executor-test")
    app.any_model()(lambda name: name)
    app.handler("h")(handler)
    return run_one(app, lost=lost)[1]


def test_a_handler_catching_its_yield_gives_way_all_the_same(caplog: pytest.LogCaptureFixture) -> None:
    """Found by a handler author: a handler wrapping its work in ``except Exception`` turned
    its yield into a failure (an attempt spent, its checkpoint dropped) or, swallowing it,
    into a success with a partial result."""
    def wraps(model: Any, payload: Any, ctx: Context) -> Any:
        try:
            ctx.yield_now({"i": 3})
        except Exception as exc:
            raise RuntimeError("wrapped") from exc

    def swallows(model: Any, payload: Any, ctx: Context) -> Any:
        try:
            ctx.yield_now({"i": 3})
        except BaseException:  # noqa: BLE001 - the mistake under test
            return "partial"

    def reraises(model: Any, payload: Any, ctx: Context) -> Any:
        try:
            ctx.yield_now({"i": 3})
        except BaseException as exc:  # noqa: BLE001 - the mistake under test
            raise RuntimeError("after the yield") from exc

    for handler in (wraps, swallows, reraises):
        call = run_yielding(handler)
        assert call.script == "requeue", handler.__name__
        assert '{"i":3}' in call.args, (handler.__name__, call.args)
    assert "task.yield_caught task=t1 worker=w: the handler raised RuntimeError" in caplog.text


def test_a_yield_or_failure_after_a_cancel_is_not_sent(caplog: pytest.LogCaptureFixture) -> None:
    """Found by a handler author: a canceled task's handler that yielded (should_yield turns
    true) was logged as preempted, and one whose progress report raised StaleLease as a
    retryable failure with a traceback; the server refused both sends."""
    caplog.set_level(logging.INFO)

    def polite(model: Any, payload: Any, ctx: Context) -> Any:
        if ctx.should_yield():
            ctx.yield_now()

    def reports(model: Any, payload: Any, ctx: Context) -> Any:
        from gpuq.errors import StaleLease
        raise StaleLease("task t1: lease lost")

    assert run_yielding(polite, lost=True) is None
    assert run_yielding(reports, lost=True) is None
    assert "preempt.yielded" not in caplog.text and "task.failed" not in caplog.text
    assert "lease.lost task=t1 worker=w: yield not sent (its run was canceled or taken back)" in caplog.text
    assert "lease.lost task=t1 worker=w: failure not sent" in caplog.text
