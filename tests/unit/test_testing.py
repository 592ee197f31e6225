"""gpuq.testing: users run their handlers through the real scripts without GPUs or Redis."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gpuq import App, Context, State, TaskError
from gpuq.config import Config
from gpuq.errors import AppError, StopTask, TaskFailed
from gpuq.testing import call_handler, drain, memory_queue


def make_app() -> App:
    app = App("t")

    @app.model("small", vram_gb=4)
    def load_small(name: str) -> str:
        return f"weights:{name}"

    @app.handler("echo", model="small")
    def echo(model: str, payload: dict[str, int], ctx: object) -> dict[str, object]:
        return {"model": model, "n": payload["n"] * 2}

    @app.handler("boom", model="small")
    def boom(model: str, payload: object, ctx: object) -> None:
        raise ValueError("bad input")

    @app.handler("refuse", model="small")
    def refuse(model: str, payload: object, ctx: object) -> None:
        raise TaskError("bad input", retry=False)

    return app


def test_drain_runs_what_fits_and_records_results() -> None:
    app = make_app()
    q = memory_queue()
    ok = q.enqueue("echo", {"n": 21}, model="small", vram_gb=6)
    too_big = q.enqueue("echo", {"n": 1}, model="small", vram_gb=200)
    bad = q.enqueue("boom", None, model="small", vram_gb=6, max_attempts=1)
    unknown = q.enqueue("missing", None, model="small", vram_gb=6)
    assert drain(q, app, vram_gb=24) == 3
    assert ok.result(timeout=0) == {"model": "weights:small", "n": 42}
    assert too_big.status() is State.QUEUED  # 200 GB fits no 24 GB GPU
    with pytest.raises(TaskFailed, match="ValueError: bad input"):
        bad.result(timeout=0)
    with pytest.raises(TaskFailed, match="not registered"):
        unknown.result(timeout=0)


def test_a_handler_raising_task_error_without_retry_fails_at_once() -> None:
    app = make_app()
    q = memory_queue()
    refused = q.enqueue("refuse", None, model="small", vram_gb=6, max_attempts=3)
    retried = q.enqueue("boom", None, model="small", vram_gb=6, max_attempts=3)
    assert drain(q, app, vram_gb=24, wait_s=0) == 2
    with pytest.raises(TaskFailed, match="failed: bad input$"):
        refused.result(timeout=0)
    assert refused.record().attempt == 1
    assert retried.status() is State.DELAYED  # any other exception: retried after its backoff


def test_drain_runs_retries_that_come_due_within_its_wait() -> None:
    """Regression: drain stopped at the first claim that found nothing, leaving a retry
    delayed: a test's result then hung on its backoff and other tasks' run times. Retries
    due within ``wait_s`` run to their end; a task delayed for longer stays delayed."""
    q = memory_queue(config=Config(pool="test", retry_base_s=0.05))
    retried = q.enqueue("boom", None, model="small", vram_gb=6, max_attempts=3)
    later = q.enqueue("echo", {"n": 1}, model="small", vram_gb=6, delay_s=3600)
    started = time.monotonic()
    assert drain(q, make_app(), vram_gb=24) == 3
    assert time.monotonic() - started < 5  # the retries' backoff, not the hour's delay
    with pytest.raises(TaskFailed, match="ValueError: bad input"):
        retried.result(timeout=0)
    assert retried.record().attempt == 3
    assert later.status() is State.DELAYED


def test_call_handler_refuses_a_result_a_worker_would_not_ack() -> None:
    """Regression: call_handler returned a result that is not JSON, which a worker (and
    drain) fails the task for."""
    app = make_app()

    @app.handler("opaque", model="small")
    def opaque(model: str, payload: object, ctx: object) -> dict[str, object]:
        return {"x": object()}

    with pytest.raises(TaskError, match="handler returned a result that is not JSON"):
        call_handler(app, "opaque", model="small")


def test_drain_fails_a_task_whose_model_no_gpu_of_its_size_holds_without_retry() -> None:
    app = make_app()

    @app.model("huge", vram_gb=100)  # the claim sees the task's 6 GB, the load needs 100
    def load_huge(name: str) -> str:
        return name

    @app.handler("any")
    def run_any(model: str, payload: object, ctx: object) -> None:
        return None

    q = memory_queue()
    task = q.enqueue("any", None, model="huge", vram_gb=6, max_attempts=3)
    assert drain(q, app, vram_gb=24) == 1
    with pytest.raises(TaskFailed, match="more VRAM than 24 GB"):
        task.result(timeout=0)


def test_call_handler_runs_one_handler_directly() -> None:
    assert call_handler(make_app(), "echo", {"n": 2}, model="small") == {
        "model": "weights:small", "n": 4}
    with pytest.raises(AppError, match="not registered"):
        call_handler(make_app(), "nope", model="small")


def async_app() -> App:
    app = App("async")

    @app.model("engine", vram_gb=4)
    async def load(name: str) -> str:
        await asyncio.sleep(0)
        return f"engine:{name}"

    @app.handler("chat", model="engine")
    async def chat(model: str, payload: dict[str, int], ctx: object) -> dict[str, object]:
        await asyncio.sleep(0)
        return {"model": model, "n": payload["n"], "thread": threading.current_thread().name}

    return app


def test_async_loaders_and_handlers_run_directly_and_through_drain() -> None:
    got = call_handler(async_app(), "chat", {"n": 1}, model="engine")
    assert got == {"model": "engine:engine", "n": 1, "thread": "gpuq-testing"}
    q = memory_queue()
    tasks = [q.enqueue("chat", {"n": i}, model="engine", vram_gb=5) for i in range(3)]
    before = {t.name for t in threading.enumerate()}
    assert drain(q, async_app()) == 3
    assert [t.result(timeout=0)["n"] for t in tasks] == [0, 1, 2]
    assert {t.name for t in threading.enumerate()} <= before  # its event loop was closed


def timeout_app(seen: list[str]) -> App:
    """Handlers bound to 0.2 s that run until stopped (at most CAP_S, so the code before
    drain enforced the bound ends them too, and the test fails rather than hangs)."""
    app = App("timeouts")
    cap_s = 10.0

    @app.any_model()
    def load(name: str) -> str:
        return name

    @app.handler("polite", timeout_s=0.2)
    def polite(model: str, payload: object, ctx: Context) -> str:
        until = time.monotonic() + cap_s
        while time.monotonic() < until:
            if ctx.should_stop():
                seen.append("should_stop")
                return "stopped"
            time.sleep(0.01)
        return "ran on"

    @app.handler("deaf", timeout_s=0.2)
    def deaf(model: str, payload: object, ctx: Context) -> str:
        until = time.monotonic() + cap_s
        try:
            while time.monotonic() < until:
                time.sleep(0.01)
        except StopTask:
            seen.append("StopTask")
            raise
        return "ran on"

    return app


@pytest.mark.parametrize(("handler", "seen_as"), [("polite", "should_stop"), ("deaf", "StopTask")])
def test_drain_enforces_a_handlers_timeout_as_a_worker_does(handler: str, seen_as: str) -> None:
    seen: list[str] = []
    q = memory_queue(config=Config(pool="test", grace_s=0.1))
    task = q.enqueue(handler, None, model="m", vram_gb=1, max_attempts=1)
    before = {t.name for t in threading.enumerate()}
    assert drain(q, timeout_app(seen)) == 1
    assert seen == [seen_as]  # told to stop, or stopped past the grace, as on a worker
    with pytest.raises(TaskFailed, match="ran past its 0.2 s timeout$"):
        task.result(timeout=0)
    assert {t.name for t in threading.enumerate()} <= before  # its watcher was joined
