"""Producers (sync one by one, asyncio, bulk) and a canceler, each in its own thread.

A producer records a task as acknowledged only when its enqueue call returned success. A call
that failed (Redis down or restarting) is retried with the same task id until it succeeds; a
retry answered "already exists" means an earlier try did reach the server, and is counted as
acknowledged too (and as such a retry). Each producer spreads its tasks evenly over the
enqueue window.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from gpuq.aio import AsyncQueue
from gpuq.client import Queue
from gpuq.errors import DuplicateTask, GpuqError, TaskAlreadyFinished

RETRY_FOR_S = 120.0  # a producer gives one task up after retrying this long


class Ledger:
    """What the producers were told, shared by their threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[str, str] = {}  # task id -> producer
        self.acked_at: dict[str, float] = {}  # task id -> time.time() of the acknowledgement
        self.given_up: list[str] = []
        self.errors: Counter[str] = Counter()  # failed tries by error type
        self.duplicate_retries = 0
        self.duplicate_first_tries = 0
        self.canceled: dict[str, str] = {}  # task id -> state cancel found it in
        self.cancels_unknown: set[str] = set()  # cancels whose call failed (applied or not)

    def ack(self, task_id: str, producer: str) -> None:
        with self.lock:
            self.acked[task_id] = producer
            self.acked_at[task_id] = time.time()

    def duplicate(self, retried: bool) -> bool:
        """An enqueue answered "already exists": after a failed try, the server had taken
        that try (acknowledged now); on a first try, the client itself sent the call twice
        (not acknowledged: the producer was told it failed). True if acknowledged."""
        with self.lock:
            if retried:
                self.duplicate_retries += 1
            else:
                self.duplicate_first_tries += 1
        return retried

    def error(self, exc: BaseException) -> None:
        with self.lock:
            self.errors[type(exc).__name__] += 1


def paced(n: int, index: int, start: float, window_s: float) -> float:
    """Seconds to wait before item ``index`` of ``n`` spread over the window."""
    return max(0.0, start + window_s * index / max(1, n) - time.monotonic())


class Sending:
    """One task's enqueue, sent until the server acknowledges it (or says it has it
    already), with backoff, for RETRY_FOR_S at most: the sync and async producers do the
    sending and the waiting, this decides."""

    def __init__(self, ledger: Ledger, task_id: str, producer: str) -> None:
        self.ledger, self.task_id, self.producer = ledger, task_id, producer
        self.give_up = time.monotonic() + RETRY_FOR_S
        self.delay, self.tried = 0.05, False

    def open(self, stop: threading.Event) -> bool:
        return not stop.is_set() and time.monotonic() < self.give_up

    def after(self, exc: GpuqError | None) -> float | None:
        """After one send (``exc``: how it failed): None when the task is settled, else the
        seconds to wait before sending it again."""
        if isinstance(exc, DuplicateTask):
            if self.ledger.duplicate(self.tried):
                self.ledger.ack(self.task_id, self.producer)
            return None
        if exc is not None:
            self.ledger.error(exc)
            self.tried = True
            wait, self.delay = self.delay, min(2.0, self.delay * 2)
            return wait
        self.ledger.ack(self.task_id, self.producer)
        return None

    def abandon(self) -> None:
        with self.ledger.lock:
            self.ledger.given_up.append(self.task_id)


def retrying(ledger: Ledger, stop: threading.Event, task_id: str, producer: str,
             send: Callable[[], Any]) -> None:
    sending = Sending(ledger, task_id, producer)
    while sending.open(stop):
        try:
            send()
            wait = sending.after(None)
        except GpuqError as exc:
            wait = sending.after(exc)
        if wait is None:
            return
        stop.wait(wait)
    sending.abandon()


def sync_producer(url: str, pool: str, items: list[dict[str, Any]], ledger: Ledger,
                  stop: threading.Event, window_s: float) -> None:
    queue = Queue.from_url(url, pool)
    start = time.monotonic()
    try:
        for i, item in enumerate(items):
            if stop.wait(paced(len(items), i, start, window_s)):
                return
            retrying(ledger, stop, item["task_id"], "sync",
                     lambda item=item: queue.enqueue(**item))  # type: ignore[misc]
    finally:
        queue.close()


def bulk_producer(url: str, pool: str, items: list[dict[str, Any]], ledger: Ledger,
                  stop: threading.Event, window_s: float, batch: int = 25) -> None:
    """Batches through enqueue_many; a batch whose call failed is sent again task by task
    (the server may have taken some of its chunks)."""
    queue = Queue.from_url(url, pool)
    batches = [items[i:i + batch] for i in range(0, len(items), batch)]
    start = time.monotonic()
    try:
        for i, chunk in enumerate(batches):
            if stop.wait(paced(len(batches), i, start, window_s)):
                return
            try:
                queue.enqueue_many(chunk)
            except GpuqError as exc:
                ledger.error(exc)
                for item in chunk:
                    retrying(ledger, stop, item["task_id"], "bulk", _resend(queue, item))
                continue
            for item in chunk:
                ledger.ack(item["task_id"], "bulk")
    finally:
        queue.close()


def _resend(queue: Queue, item: dict[str, Any]) -> Callable[[], Any]:
    def send() -> None:
        try:
            queue.enqueue(**item)
        except DuplicateTask:
            return  # this one was in a chunk the server took before the failure
    return send


def async_producer(url: str, pool: str, items: list[dict[str, Any]], ledger: Ledger,
                   stop: threading.Event, window_s: float) -> None:
    asyncio.run(_async_produce(url, pool, items, ledger, stop, window_s))


async def _async_produce(url: str, pool: str, items: list[dict[str, Any]], ledger: Ledger,
                         stop: threading.Event, window_s: float) -> None:
    queue = AsyncQueue.from_url(url, pool)
    start = time.monotonic()
    try:
        for i, item in enumerate(items):
            await asyncio.sleep(paced(len(items), i, start, window_s))
            if stop.is_set():
                return
            sending = Sending(ledger, item["task_id"], "async")
            while sending.open(stop):
                try:
                    await queue.enqueue(**item)
                    wait = sending.after(None)
                except GpuqError as exc:
                    wait = sending.after(exc)
                if wait is None:
                    break
                await asyncio.sleep(wait)
            else:
                sending.abandon()
    finally:
        await queue.close()


def canceler(url: str, pool: str, ledger: Ledger, stop: threading.Event, share: float,
             seed: int) -> None:
    """Cancel about ``share`` of the acknowledged tasks, a random while after their enqueue
    (some still queued, some running, some already ended)."""
    rng = random.Random(seed + 7)
    queue = Queue.from_url(url, pool)
    seen = 0
    try:
        while not stop.wait(0.25):
            with ledger.lock:
                fresh = list(ledger.acked)[seen:]
            seen += len(fresh)
            for task_id in fresh:
                if rng.random() >= share or stop.is_set():
                    continue
                stop.wait(rng.uniform(0, 0.3))
                try:
                    state = queue.cancel(task_id).value
                except TaskAlreadyFinished as exc:
                    state = f"already {exc.state}"
                except GpuqError as exc:
                    ledger.error(exc)
                    with ledger.lock:
                        ledger.cancels_unknown.add(task_id)
                    continue
                with ledger.lock:
                    ledger.canceled[task_id] = state
    finally:
        queue.close()
