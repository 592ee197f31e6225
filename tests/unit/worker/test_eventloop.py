"""The worker's event loop (gpuq.worker.eventloop): started on first use, runs coroutines for
blocked threads, cancels them from any thread and waits for them to unwind."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Generator
from typing import Any

import pytest

from gpuq.errors import StopTask
from gpuq.worker.eventloop import EventLoop


@pytest.fixture
def aio() -> Generator[EventLoop, None, None]:
    loop = EventLoop("test-loop")
    yield loop
    loop.close()


def test_the_loop_starts_only_when_used_and_closes_cleanly() -> None:
    loop = EventLoop("never-used")
    assert not loop.started
    loop.close()  # nothing to stop
    loop.close()
    used = EventLoop("used")
    assert used.call().run(asyncio.sleep(0, result=7)) == 7
    assert used.started
    thread = next(t for t in threading.enumerate() if t.name == "used")
    used.close()
    assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        used.call()


def test_a_coroutine_runs_on_the_loop_thread_and_its_exception_reaches_the_caller(
        aio: EventLoop) -> None:
    async def where() -> str:
        return threading.current_thread().name

    assert aio.call().run(where()) == "test-loop"

    async def boom() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        aio.call().run(boom())


def test_many_callers_share_one_loop_concurrently(aio: EventLoop) -> None:
    """Four blocked threads: their coroutines run at once (each waits for all four)."""
    arrived: list[int] = []
    all_in = asyncio.Event()
    results: list[Any] = []

    async def meet(i: int) -> int:
        arrived.append(i)
        if len(arrived) == 4:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), 5)
        return i

    threads = [threading.Thread(target=lambda i=i: results.append(aio.call().run(meet(i))))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(results) == [0, 1, 2, 3]


def test_cancel_raises_cancelled_error_inside_and_waits_for_the_unwinding(aio: EventLoop) -> None:
    seen: list[str] = []
    started = threading.Event()

    async def handler() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            await asyncio.sleep(0.05)  # unwinding takes a while: the caller waits for it
            seen.append("unwound")

    call = aio.call()
    errors: list[BaseException] = []

    def runner() -> None:
        try:
            call.run(handler())
        except BaseException as exc:
            errors.append(exc)
            errors.append(RuntimeError(",".join(seen)))  # what had happened when run() returned

    t = threading.Thread(target=runner)
    t.start()
    assert started.wait(5)
    assert call.cancel()
    t.join(5)
    assert isinstance(errors[0], StopTask) and "was cancelled" in str(errors[0])
    assert str(errors[1]) == "cancelled,unwound"


def test_a_cancel_before_the_start_stops_the_coroutine_before_its_body(aio: EventLoop) -> None:
    ran: list[bool] = []

    async def handler() -> None:
        ran.append(True)

    call = aio.call()
    call.cancel()
    with pytest.raises(StopTask):
        call.run(handler())
    assert ran == []


def test_a_handler_swallowing_the_cancel_returns_its_result(aio: EventLoop) -> None:
    started = threading.Event()

    async def handler() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "kept going"
        return "slept"

    call = aio.call()
    threading.Timer(0.0, lambda: started.wait(5) and call.cancel()).start()
    assert call.run(handler()) == "kept going"


def test_a_coroutine_cancelling_itself_ends_as_stopped(aio: EventLoop) -> None:
    async def handler() -> None:
        raise asyncio.CancelledError

    with pytest.raises(StopTask, match="cancelled"):
        aio.call().run(handler())


def test_wait_runs_any_awaitable(aio: EventLoop) -> None:
    class Ready:
        def __await__(self) -> Generator[Any, None, str]:
            yield from asyncio.sleep(0).__await__()
            return "ready"

    assert aio.wait(Ready()) == "ready"
    assert aio.wait(asyncio.sleep(0, result=3)) == 3


def test_close_cancels_what_still_runs() -> None:
    loop = EventLoop("closing")
    seen: list[str] = []
    started = threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    errors: list[BaseException] = []

    def runner() -> None:
        try:
            loop.call().run(forever())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=runner)
    t.start()
    assert started.wait(5)
    loop.close(timeout=2)
    t.join(5)
    assert seen == ["cancelled"] and isinstance(errors[0], StopTask)


def test_a_call_on_a_closed_loop_fails_without_leaving_a_coroutine_unawaited() -> None:
    loop = EventLoop("closed")
    call = loop.call()
    loop.close()
    with pytest.raises(RuntimeError, match="closed"):
        call.run(asyncio.sleep(0))  # closed, not left for the garbage collector to warn about
    assert call.cancel() is False
