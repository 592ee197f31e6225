"""Run handlers without GPUs or a Redis server: for users' own tests.

    from gpuq.testing import memory_queue, drain
    q = memory_queue()                       # the real Lua scripts on fakeredis
    t = q.enqueue("llm.generate", {"prompt": "hi"}, model="llama3-8b", vram_gb=16)
    drain(q, app, vram_gb=80)                # claims and runs every task it can, in-process
    assert t.result(timeout=0) == {...}

``drain`` runs each task through the worker's own executor (model loads and evictions,
the handler, its ack or fail; an ``async def`` handler on an event loop of its own), as one
worker with one slot; a batch handler's tasks run in batches as on a worker (taken by
its claim, or claim_batch.lua after a cold start), without waiting for more. Its presence
writes only what those model changes write (the holders sets, the models and free VRAM of
its hash) and it leaves the pool when done; it registers nothing, so no GPU class or
handler name it brings changes what enqueue's fit check says afterwards. Once every task
is run it sends the run times measured, as a worker's heartbeat does (learn.lua), so a
task enqueued afterwards without ``est_s`` gets the learned mean.

A handler's ``timeout_s`` is enforced as on a worker (gpuq.worker.control): a call still
running past it fails its task, retryable, with ``ran past its N s timeout``; the handler sees
``ctx.should_stop()`` at once and, past the config's ``grace_s``, ``StopTask`` (an async one:
its asyncio task cancelled). A handler that will not stop even then (native code, or one that
swallows ``StopTask``) keeps ``drain`` waiting, where a worker would exit with code 75.

Needs the testing extra (``pip install 'gpuq[testing]'``, as README says) for fakeredis.
"""

from __future__ import annotations

import inspect
import math
import threading
import time
from typing import Any

from gpuq.app import App, Context
from gpuq.client import Queue
from gpuq.config import Config
from gpuq.errors import AppError
from gpuq.scripts import ClaimRequest
from gpuq.worker import batch, outcome
from gpuq.worker.control import Control
from gpuq.worker.eventloop import EventLoop
from gpuq.worker.executor import Executor
from gpuq.worker.models import ModelCache
from gpuq.worker.observer import Observer
from gpuq.worker.presence import Presence
from gpuq.worker.running import RunningSet
from gpuq.worker.runtimes import RunTimes


def memory_queue(pool: str = "test", config: Config | None = None) -> Queue:
    """A queue on an in-memory server (fakeredis with Lua) that runs gpuq's real scripts."""
    try:
        import fakeredis
    except ImportError:
        raise AppError("gpuq.testing.memory_queue needs fakeredis with Lua: "
                       "pip install 'gpuq[testing]'") from None

    cfg = config or Config(pool=pool)
    return Queue(fakeredis.FakeRedis(decode_responses=True), cfg, url="fakeredis")


def call_handler(app: App, handler: str, payload: Any = None, *, model: str,
                 vram_gb: float = 1.0, est_s: float = 0.0) -> Any:
    """Load the model and run one handler directly, as a worker would (no queue); a result
    a worker would refuse (not JSON, too large) raises its TaskError."""
    problem = app.check(handler, model)
    if problem:
        raise AppError(problem)
    spec = app.model_spec(model)
    assert spec is not None
    ctx = Context("test", 1, "test-worker", model, vram_gb, est_s)
    aio = EventLoop("gpuq-testing")  # an async loader or handler runs on it, as on a worker
    try:
        loaded = spec.load(model)
        if inspect.isawaitable(loaded):
            loaded = aio.wait(loaded)
        result = app.handlers[handler].fn(loaded, payload, ctx)
        result = aio.wait(result) if inspect.isawaitable(result) else result
        outcome.encode(result)  # a worker acks the JSON text, or fails the task
        return result
    finally:
        aio.close()


def drain(queue: Queue, app: App, *, vram_gb: float = 80.0, worker_id: str = "test-worker",
          limit: int = 10_000, wait_s: float = 10.0) -> int:
    """Claim and run tasks in-process through the real scripts until none fits, then send
    their run times; returns how many ran (a batch may take the count past ``limit``).
    A delayed task (a retry waiting out its backoff, ``delay_s``) due within ``wait_s`` is
    waited for and run (the backoff is real time: ``Config(retry_base_s=...)`` shortens
    it); 0 leaves such tasks delayed."""
    cache = ModelCache(app, vram_gb, queue.config.kv_reserve_gb)
    presence = Presence(queue.redis, queue.keys, worker_id)
    runtimes = RunTimes(capacity=max(1, limit))  # every run kept until the one send at the end
    tasks = RunningSet()
    executor = Executor(app, cache, presence, tasks, queue.scripts, queue.calls, Observer(), runtimes)
    batches = batch.wanted(app)
    enforcer = timeouts(queue, executor, tasks)
    try:
        while tasks.tasks_run < limit:
            req = ClaimRequest(worker_id, cache.free_gb(), cache.evictable_gb(), 1, cache.loaded(),
                               batches=batches)
            claim = queue.scripts.run(queue.calls.claim(req))
            if claim.task is None:
                if (pause := due_in(queue, wait_s)) is None:
                    break
                time.sleep(pause)  # the next claim promotes the task come due
                continue
            fields = claim.task
            with cache.lock:
                res, running = executor.begin(fields)
                added = batch.begin_added(executor, claim.batch)
            if res is None and running.rejected is None:
                # a model larger than this GPU: in-process there is no other GPU to retry on
                running.rejected = f"task needs more VRAM than {vram_gb:g} GB can free"
            for call in batch.execute(executor, (fields, res, running), added=added):
                executor.settle(call, queue.scripts.run_raw(call))
        # the loop ended with the server reachable: an error above skips this and is raised
        runtimes.send(queue.scripts, queue.calls, rounds=None)
    finally:
        if enforcer is not None:
            enforcer.stop()
        presence.leave(cache.model_names())
        cache.aio.close()  # the loop async handlers ran on, if any did
    return tasks.tasks_run


def due_in(queue: Queue, within_s: float) -> float | None:
    """Seconds until the pool's next delayed task is due (a little past, so that the
    server's clock has passed it), or None when there is none within ``within_s``."""
    first = queue.redis.zrange(queue.keys.delayed, 0, 0, withscores=True)
    if not first:
        return None
    seconds, micros = queue.redis.time()
    left = (float(first[0][1]) - (seconds * 1000 + micros / 1000)) / 1000
    return max(0.0, left) + 0.005 if left <= within_s else None


class Timeouts(threading.Thread):
    """The deadlines a worker's heartbeat thread keeps (Control.watch), while ``drain``
    runs handlers in its caller's thread: here only timeouts and the stops that follow them
    come up (no control list is read, no lease is renewed or lost)."""

    def __init__(self, control: Control) -> None:
        super().__init__(name="gpuq-testing-timeouts", daemon=True)
        self.control = control
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(max(0.01, self.control.watch())):
            pass

    def stop(self) -> None:
        self.done.set()
        self.join()


def timeouts(queue: Queue, executor: Executor, tasks: RunningSet) -> Timeouts | None:
    """A started ``Timeouts`` when a handler of the app has a ``timeout_s``, else None."""
    if all(spec.timeout_s is None for spec in executor.app.handlers.values()):
        return None
    # stop_s infinite: a handler that will not stop is waited for (its thread is the test's),
    # not answered with the worker's exit; "drain" never comes, as no control list is read
    control = Control(queue.redis, queue.keys, executor, tasks, stop_s=math.inf,
                      grace_s=queue.config.grace_s, stopping=threading.Event(), drain=lambda: None)
    thread = Timeouts(control)
    thread.start()
    return thread
