"""The executor's async path on fakeredis: an ``async def`` handler runs on the worker's event
loop while its runner thread waits; results, yields, failures and stops end as a blocking
handler's do, and concurrent tasks share one model whose weights the ledger counts once."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Generator
from typing import Any

import pytest

from gpuq.app import App, BatchContext, Context
from gpuq.client import Queue
from gpuq.scripts import Call, ClaimRequest
from gpuq.task import State
from gpuq.testing import memory_queue
from gpuq.worker import batch
from gpuq.worker.control import Control
from gpuq.worker.executor import Claimed, Executor
from gpuq.worker.models import ModelCache
from gpuq.worker.observer import Observer
from gpuq.worker.presence import Presence
from gpuq.worker.running import RunningSet
from gpuq.worker.runtimes import RunTimes

WEIGHTS, NEED = 16.0, 18.0  # each task: 2 GB of working memory above the shared weights


class Engine:
    """What an async loader built: counts who used it."""

    def __init__(self) -> None:
        self.requests = 0
        self.closed_on: str | None = None


def make_app(loads: list[str], gate: asyncio.Event | None = None) -> App:
    app = App("async-test")

    async def close(engine: Engine) -> None:
        engine.closed_on = threading.current_thread().name

    @app.model("llm", vram_gb=WEIGHTS, unload=close)
    async def load(name: str) -> Engine:
        loads.append(threading.current_thread().name)
        await asyncio.sleep(0.01)
        return Engine()

    @app.handler("gen", model="llm")
    async def gen(engine: Engine, payload: Any, ctx: Context) -> dict[str, Any]:
        engine.requests += 1
        if gate is not None:
            await asyncio.wait_for(gate.wait(), 10)
        return {"thread": threading.current_thread().name, "engine": id(engine), "n": payload}

    @app.handler("sync", model="llm")
    def sync(engine: Engine, payload: Any, ctx: Context) -> dict[str, Any]:
        return {"thread": threading.current_thread().name, "engine": id(engine)}

    @app.handler("polite", model="llm")
    async def polite(engine: Engine, payload: Any, ctx: Context) -> None:
        steps = int(ctx.checkpoint or 0)
        while True:
            if ctx.should_yield():
                ctx.yield_now(steps)
            steps += 1
            await asyncio.sleep(0.005)

    @app.handler("stubborn", model="llm")
    async def stubborn(engine: Engine, payload: Any, ctx: Context) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            payload_seen.append("cancelled")
            raise

    @app.handler("broken", model="llm")
    async def broken(engine: Engine, payload: Any, ctx: Context) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("engine fell over")

    @app.handler("aborting", model="llm")
    async def aborting(engine: Engine, payload: Any, ctx: Context) -> None:
        await asyncio.sleep(0)
        raise Aborted("engine aborted the request")

    @app.handler("aborting.sync", model="llm")
    def aborting_sync(engine: Engine, payload: Any, ctx: Context) -> None:
        raise KeyboardInterrupt("from the handler")

    @app.handler("aborting.batch", model="llm", batch=4)
    async def aborting_batch(engine: Engine, payloads: list[Any], ctx: BatchContext) -> None:
        await asyncio.sleep(0)
        raise Aborted("engine aborted the batch")

    @app.handler("gen.batch", model="llm", batch=4)
    async def gen_batch(engine: Engine, payloads: list[Any], ctx: BatchContext) -> list[Any]:
        await asyncio.sleep(0)
        return [{"n": p, "batch": len(payloads)} for p in payloads]

    return app


payload_seen: list[str] = []


class Aborted(BaseException):
    """What a library may raise that is no Exception (as pytest's outcomes are)."""


@pytest.fixture
def q() -> Queue:
    return memory_queue()


@pytest.fixture
def loads() -> list[str]:
    return []


@pytest.fixture
def ex(q: Queue, loads: list[str]) -> Generator[Executor, None, None]:
    ex = make_executor(q, make_app(loads))
    yield ex
    ex.cache.aio.close()


def make_executor(q: Queue, app: App) -> Executor:
    cache = ModelCache(app, 80, q.config.kv_reserve_gb)
    return Executor(app, cache, Presence(q.redis, q.keys, "w"), RunningSet(), q.scripts, q.calls,
                    Observer(), RunTimes())


def claim(q: Queue, ex: Executor, slots: int = 1) -> Claimed:
    req = ClaimRequest("w", ex.cache.free_gb(), ex.cache.evictable_gb(), slots, ex.cache.loaded())
    fields = q.scripts.run(q.calls.claim(req)).task
    assert fields is not None
    with ex.cache.lock:
        return (fields, *ex.begin(fields))


def settle(q: Queue, ex: Executor, call: Call[Any] | None) -> None:
    assert call is not None
    ex.settle(call, q.scripts.run_raw(call))


def test_an_async_handler_runs_on_the_loop_and_its_result_is_acked(q: Queue, ex: Executor,
                                                                   loads: list[str]) -> None:
    t = q.enqueue("gen", 1, model="llm", vram_gb=NEED)
    call = ex.execute(*claim(q, ex))
    assert call is not None and call.script == "ack"
    settle(q, ex, call)
    record = q.record(t.id)
    assert record.state is State.SUCCEEDED
    assert record.result["thread"] == "gpuq-async"
    assert loads == ["gpuq-async"]  # the async loader ran on the loop too
    assert ex.cache.working_gb == 0 and len(ex.running) == 0


def test_sync_and_async_handlers_share_the_model_in_one_app(q: Queue, ex: Executor,
                                                            loads: list[str]) -> None:
    a = q.enqueue("gen", 1, model="llm", vram_gb=NEED)
    s = q.enqueue("sync", None, model="llm", vram_gb=NEED)
    for _ in range(2):
        settle(q, ex, ex.execute(*claim(q, ex)))
    ra, rs = q.record(a.id).result, q.record(s.id).result
    assert ra["thread"] == "gpuq-async" and rs["thread"] == threading.current_thread().name
    assert ra["engine"] == rs["engine"] and len(loads) == 1


def test_concurrent_async_tasks_share_one_model_and_count_its_weights_once(
        q: Queue, loads: list[str]) -> None:
    """Four runner threads, four coroutines on one loop, all inside the handler at once
    (each waits for the gate): the loader ran once, the ledger holds the weights once and
    each task's working memory."""
    gate = asyncio.Event()
    ex = make_executor(q, make_app(loads, gate))
    try:
        ids = [q.enqueue("gen", i, model="llm", vram_gb=NEED).id for i in range(4)]
        claimed = [claim(q, ex, slots=4 - i) for i in range(4)]
        calls: list[Call[Any] | None] = []
        threads = [threading.Thread(target=lambda c=c: calls.append(ex.execute(*c))) for c in claimed]
        for t in threads:
            t.start()
        for _ in range(500):
            engine = ex.cache.get("llm").obj
            if engine is not None and engine.requests == 4:
                break
            threading.Event().wait(0.01)
        assert engine.requests == 4  # all four inside the handler together
        assert ex.cache.free_gb() == pytest.approx(80 - 5 - WEIGHTS - 4 * (NEED - WEIGHTS))
        assert ex.cache.loaded() == [("llm", WEIGHTS)]  # what claim.lua is told: weights once
        ex.cache.aio.loop().call_soon_threadsafe(gate.set)
        for t in threads:
            t.join(10)
        for call in calls:
            settle(q, ex, call)
        records = [q.record(i) for i in ids]
        assert all(r.state is State.SUCCEEDED for r in records)
        assert len({r.result["engine"] for r in records}) == 1 and len(loads) == 1
        assert ex.cache.free_gb() == pytest.approx(80 - 5 - WEIGHTS)
    finally:
        ex.cache.aio.close()


def test_a_yield_request_reaches_an_async_handler_and_keeps_the_attempt(q: Queue,
                                                                        ex: Executor) -> None:
    t = q.enqueue("polite", None, model="llm", vram_gb=NEED)
    claimed = claim(q, ex)
    running = claimed[2]

    def ask_once_it_runs() -> None:  # not at a fixed time: a loaded host may start it late
        for _ in range(500):
            if running.in_handler:
                break
            time.sleep(0.01)
        time.sleep(0.05)  # a few of its steps
        running.ctx.yield_requested = True

    threading.Thread(target=ask_once_it_runs).start()
    call = ex.execute(*claimed)
    assert call is not None and call.script == "requeue"
    settle(q, ex, call)
    record = q.record(t.id)
    assert record.state is State.QUEUED and record.attempt == 0
    assert isinstance(record.checkpoint, int) and record.checkpoint > 0  # steps done so far
    assert ex.cache.working_gb == 0


def test_a_stubborn_async_handler_is_cancelled_at_its_yield_deadline(q: Queue, ex: Executor) -> None:
    """Control stops it as it stops a blocking handler: requeue (fenced), then the stop,
    which for an async handler cancels its asyncio task (CancelledError inside)."""
    payload_seen.clear()
    t = q.enqueue("stubborn", None, model="llm", vram_gb=NEED)
    claimed = claim(q, ex)
    running = claimed[2]
    control = Control(q.redis, q.keys, ex, ex.running, stop_s=5, grace_s=10, stopping=threading.Event(),
                      drain=lambda: None)
    out: list[Call[Any] | None] = []
    runner = threading.Thread(target=lambda: out.append(ex.execute(*claimed)))
    runner.start()
    for _ in range(500):
        if running.in_handler:
            break
        threading.Event().wait(0.01)
    q.redis.hset(q.keys.task(t.id), mapping={"yield_by": "1", "yield_for": "p0"})  # as preempt.lua
    control.on_yield(t.id, 0)
    control.watch()  # past the deadline: requeued, then cancelled
    runner.join(10)
    assert out == [None]  # the worker requeued it itself: nothing left to send
    assert payload_seen == ["cancelled"]
    assert running.stopped and not running.in_handler
    record = q.record(t.id)
    assert record.state is State.QUEUED
    assert ex.cache.working_gb == 0 and len(ex.running) == 0


def test_a_raising_async_handler_fails_for_a_retry(q: Queue, ex: Executor) -> None:
    t = q.enqueue("broken", None, model="llm", vram_gb=NEED, max_attempts=3)
    call = ex.execute(*claim(q, ex))
    assert call is not None and call.script == "fail"
    settle(q, ex, call)
    record = q.record(t.id)
    assert record.error == "RuntimeError: engine fell over"
    assert record.state is State.DELAYED and record.attempt == 1  # waiting for its retry


@pytest.mark.parametrize("handler", ["aborting", "aborting.sync"])
def test_a_handler_raising_a_base_exception_fails_its_task(q: Queue, ex: Executor,
                                                          handler: str) -> None:
    """Regression: only Exception and SystemExit were caught, so a handler raising another
    BaseException (KeyboardInterrupt, a library's own) ended the runner thread: its task
    stayed running for ever (the settling run's lease renewed at every beat, nothing acked
    or failed) and the worker had a slot fewer until it restarted."""
    t = q.enqueue(handler, None, model="llm", vram_gb=NEED, max_attempts=1)
    call = ex.execute(*claim(q, ex))
    assert call is not None and call.script == "fail"
    settle(q, ex, call)
    record = q.record(t.id)
    assert record.state is State.FAILED and record.error is not None
    assert record.error.startswith(("Aborted: engine aborted", "KeyboardInterrupt: from the"))
    assert ex.running.settling() == [] and not len(ex.running)


def test_an_async_batch_handler_raising_a_base_exception_fails_its_tasks(
        q: Queue, ex: Executor) -> None:
    ids = [q.enqueue("aborting.batch", i, model="llm", vram_gb=NEED, max_attempts=1).id
           for i in range(2)]
    for call in batch.execute(ex, claim(q, ex)):
        settle(q, ex, call)
    assert [q.record(i).state for i in ids] == [State.FAILED, State.FAILED]


def test_an_async_batch_handler_runs_its_batch_on_the_loop(q: Queue, ex: Executor) -> None:
    ids = [q.enqueue("gen.batch", i, model="llm", vram_gb=NEED).id for i in range(3)]
    for call in batch.execute(ex, claim(q, ex)):
        settle(q, ex, call)
    results = [q.record(i).result for i in ids]
    assert results == [{"n": i, "batch": 3} for i in range(3)]


def test_an_async_unloader_runs_on_the_loop(q: Queue, ex: Executor) -> None:
    q.enqueue("gen", 1, model="llm", vram_gb=NEED)
    settle(q, ex, ex.execute(*claim(q, ex)))
    engine = ex.cache.get("llm").obj
    (resident,) = ex.cache.evict_idle()
    ex.cache.unload(resident)
    assert engine.closed_on == "gpuq-async" and resident.obj is None


def test_a_worker_whose_app_has_no_coroutine_never_starts_the_loop(q: Queue) -> None:
    app = App("plain")
    app.any_model()(lambda name: name)
    app.handler("echo")(lambda model, payload, ctx: payload)
    ex = make_executor(q, app)
    t = q.enqueue("echo", {"x": 1}, model="m", vram_gb=4)
    settle(q, ex, ex.execute(*claim(q, ex)))
    assert q.record(t.id).result == {"x": 1}
    assert not ex.cache.aio.started
    assert json.loads(q.redis.hget(q.keys.task(t.id), "result") or "null") == {"x": 1}
