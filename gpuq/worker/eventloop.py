"""The worker's event loop: where ``async def`` handlers and async model loaders run.

One asyncio loop per worker, in a daemon thread of its own, started the first time
something async needs it (a worker whose app has no coroutine never starts it). A runner
thread that claimed a task for an async handler hands the coroutine over (``AsyncCall``) and
blocks until it ends; the claim, the ack, the ledger and the lease stay with the runner
threads and the heartbeat as for a blocking handler, so the ``--concurrency N`` runner slots
become N coroutines on one loop, sharing one model object (an engine that batches them).

``AsyncCall.cancel`` (any thread) cancels the coroutine's asyncio task: CancelledError is
raised inside the handler at its current ``await``. The runner still waits for the task to
end (its ``finally`` blocks, an engine letting go of the request) before the task's VRAM
goes back to the ledger; then ``AsyncCall.run`` raises StopTask, as a blocking handler
interrupted in its thread does. A handler that blocks the loop (a sync sleep or GPU call
without ``await``) stalls every task on it and cannot be cancelled: the worker's stuck-task
exit (gpuq.worker.control) covers it as it covers a blocking handler stuck in native code.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
from collections.abc import Awaitable, Coroutine
from typing import Any

from gpuq.errors import StopTask

log = logging.getLogger(__name__)
CLOSE_S = 5.0  # at close, how long cancelled tasks get to unwind


class AsyncCall:
    """One coroutine run on the loop for a blocked runner thread; cancellable from any thread
    before, while or after it runs (a cancel that comes first cancels it at its start)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False  # read and written on the loop's thread only
        self._done: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the loop; block until it ends; its result, or its exception
        (StopTask when it ended cancelled)."""
        try:
            self._loop.call_soon_threadsafe(self._start, coro)
        except RuntimeError:  # the loop closed (the worker is exiting): never started
            coro.close()
            raise
        return self._done.result()

    def cancel(self) -> bool:
        """Cancel the coroutine (thread-safe); True: the request is on its way."""
        try:
            self._loop.call_soon_threadsafe(self._cancel)
        except RuntimeError:  # the loop closed: nothing runs on it any more
            return False
        return True

    def _start(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._task = self._loop.create_task(coro)
        self._task.add_done_callback(self._finish)
        if self._cancelled:  # cancelled before it started: it ends at its first step
            self._task.cancel()

    def _cancel(self) -> None:
        self._cancelled = True
        if self._task is not None:
            self._task.cancel()

    def _finish(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():  # by cancel, by the loop's close, or by the handler itself
            self._done.set_exception(StopTask("the handler's asyncio task was cancelled"))
        elif (exc := task.exception()) is not None:
            self._done.set_exception(exc)
        else:
            self._done.set_result(task.result())


class EventLoop:
    """The loop thread, started on first use; ``close`` stops it."""

    def __init__(self, name: str = "gpuq-async") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closing = False

    @property
    def started(self) -> bool:
        return self._loop is not None

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, started now if it is not yet."""
        with self._lock:
            if self._closing:
                raise RuntimeError("the worker's event loop is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()
                self._thread = threading.Thread(target=self._serve, args=(loop, ready),
                                                name=self.name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def _serve(self, loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        while True:
            try:
                loop.run_forever()
            except BaseException:  # KeyboardInterrupt or SystemExit raised in a task
                log.exception("eventloop.error loop=%s", self.name)
                continue  # the task that raised it is done; its runner learns so
            if self._closing:
                return

    def call(self) -> AsyncCall:
        """A call to hand one coroutine to (``run``), cancellable from now on."""
        return AsyncCall(self.loop())

    def wait(self, awaitable: Awaitable[Any]) -> Any:
        """Run an awaitable (an async loader's or unloader's) on the loop from another
        thread and return its result; not cancellable."""
        if not inspect.iscoroutine(awaitable):
            awaitable = _await(awaitable)
        return self.call().run(awaitable)

    def close(self, timeout: float = CLOSE_S) -> None:
        """Cancel the tasks still on the loop, give them ``timeout`` to unwind, stop the
        thread and close the loop. Safe to call when it never started, and twice."""
        with self._lock:
            loop, thread = self._loop, self._thread
            if self._closing or loop is None or thread is None:
                self._closing = True
                return
            self._closing = True
        try:
            asyncio.run_coroutine_threadsafe(_cancel_all(timeout), loop).result(timeout + 1)
        except Exception as exc:  # a task that will not unwind: the loop is dropped anyway
            log.warning("eventloop.close loop=%s error=%r", self.name, exc)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout + 1)
        if not thread.is_alive():
            loop.close()


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


async def _cancel_all(timeout: float) -> None:
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)
    await asyncio.get_running_loop().shutdown_asyncgens()
