"""Runs one claimed task: load its model if cold, call its handler, ack or fail it (fenced)."""

from __future__ import annotations

import ctypes
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuq import catalog, worker_record
from gpuq.app import Context, Yielded
from gpuq.errors import GpuqError, StaleLease
from gpuq.scripts import Call
from gpuq.task import JSON, MAX_RESULT_BYTES
from gpuq.worker import presence
from gpuq.worker.models import Reservation

if TYPE_CHECKING:
    import redis

    from gpuq.worker.loop import Worker

log = logging.getLogger(__name__)


class StopTask(Exception):
    """Raised inside a handler's thread when it ran past its yield deadline."""


@dataclass
class Running:
    task_id: str
    token: int
    ctx: Context
    started: float
    thread_id: int = 0  # the runner thread calling the handler
    yield_deadline: float | None = None  # monotonic: asked to yield, stopped after this
    stop_deadline: float | None = None  # monotonic: stopped, the worker exits after this
    stopped: bool = False  # requeued by the worker: whatever the handler does is moot
    in_handler: bool = False
    rejected: str | None = None  # why this worker will not run it (execute fails it)
    guard: threading.Lock = field(default_factory=threading.Lock)

    def enter(self) -> None:
        with self.guard:
            self.in_handler = True

    def leave(self) -> None:
        with self.guard:
            self.in_handler = False

    def interrupt(self) -> bool:
        """Raise StopTask in the handler's thread, only while it is inside the handler (the
        guard keeps it out of the worker's own code). It lands at the handler's next Python
        step; a handler blocked in native code does not see it."""
        with self.guard:
            if not self.in_handler:
                return False
            done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id),
                                                              ctypes.py_object(StopTask))
            return bool(done)


class TaskError(Exception):
    """A failure the worker diagnoses itself; retry says whether another attempt may help."""

    def __init__(self, message: str, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


def show_models(worker: Worker, pipe: redis.client.Pipeline) -> None:
    """Send the pipe with the worker hash's view of its models and free VRAM added (for
    status, top and the wake rule). The view is taken and written under ``worker.shown``,
    as the heartbeat's is, so an older view never overwrites a newer one."""
    cache = worker.cache
    with worker.shown:
        with cache.lock:  # other runners may be changing the ledger
            shown: worker_record.Fields = {"models": ",".join(cache.model_names()),
                                      "vram_free_gb": round(cache.free_gb(), 3)}
        pipe.hset(worker.keys.worker(worker.id), mapping=shown)
        pipe.execute()


def prepare_model(worker: Worker, res: Reservation, task_id: str = "") -> Any:
    """Unload what must make room, load the model if this task is the one to, return it."""
    cache = worker.cache
    resident = cache.get(res.model)
    if res.evict:  # for a cold load, or for the working memory of a held model's task
        pipe = worker.redis.pipeline(transaction=False)
        for old in res.evict:
            cache.unload(old)
            presence.hold(pipe, worker.keys, worker.id, old.spec.name, False)
            log.info("model.evicted worker=%s model=%s", worker.id, old.spec.name)
        show_models(worker, pipe)  # before a load: until then wake-ups would still pick this worker
    if not res.cold:
        resident.ready.wait()
        if resident.error is not None:
            raise TaskError(f"loading model {res.model} failed: {resident.error}", True)
        return resident.obj
    try:
        seconds = cache.load(resident)
    except Exception as exc:
        raise TaskError(f"loading model {res.model} failed: {type(exc).__name__}: {exc}",
                        True) from None
    pipe = worker.redis.pipeline(transaction=False)
    catalog.record_load(pipe, worker.keys, res.model, resident.footprint_gb, seconds)
    presence.hold(pipe, worker.keys, worker.id, res.model, True)
    show_models(worker, pipe)
    worker.model_loads += 1
    worker.observe(task_id, phase="load", seconds=seconds)
    log.info("model.loaded worker=%s model=%s vram_gb=%g load_s=%.3f", worker.id, res.model,
             resident.footprint_gb, seconds)
    return resident.obj


def execute(worker: Worker, fields: dict[str, str], res: Reservation | None,
            running: Running) -> Call[Any] | None:
    """Run the task; return its ack, fail or yield call, which the runner sends together with
    its next claim (one round trip per task), or None when the worker already requeued it
    (stopped past its yield deadline). The task's VRAM and slot are released first."""
    task_id, token, ctx = running.task_id, running.token, running.ctx
    try:
        if running.rejected:
            raise TaskError(running.rejected, False)
        if res is None:
            raise TaskError(f"task needs {fields['vram_gb']} GB with model {fields['model']}, "
                            f"more than this GPU can free", True)
        model = prepare_model(worker, res, task_id)
        if ctx.yield_requested or running.stopped:
            # asked to yield (or stopped) while its model loaded: give way before the handler
            # starts, whether or not the handler would check soon; its checkpoint stays
            raise Yielded(task_id)
        fn = worker.app.handlers[fields["handler"]].fn
        payload = json.loads(fields["payload"])
        running.enter()
        began = time.monotonic()
        try:
            result = fn(model, payload, ctx)
        finally:
            running.leave()
        worker.observe(task_id, phase="run", seconds=time.monotonic() - began)
        if running.stopped:
            return None
        try:
            text = JSON.encode(result)
        except (TypeError, ValueError) as exc:
            raise TaskError(f"handler returned a result that is not JSON: {exc}", False) from None
        if len(text) > MAX_RESULT_BYTES:  # the ack would be refused and the lease run out
            raise TaskError(f"handler returned a result of {len(text)} bytes, more than the "
                            f"{MAX_RESULT_BYTES} allowed: store large outputs elsewhere and "
                            f"return a reference", False)
        return worker.calls.ack(task_id, token, text)
    except Yielded:
        if running.stopped:
            return None
        log.info("preempt.yielded task=%s worker=%s checkpoint=%s", task_id, worker.id,
                 "saved" if ctx.saved else "none")
        return worker.calls.requeue(task_id, token, "yielded to a higher-priority task",
                                    preempted="yielded", checkpoint=ctx.saved or "")
    except Exception as exc:
        if running.stopped:  # StopTask, or whatever the stop broke: the task is requeued
            return None
        retry = exc.retry if isinstance(exc, TaskError) else True
        message = str(exc) if isinstance(exc, TaskError) else f"{type(exc).__name__}: {exc}"
        log.info("task.failed task=%s worker=%s retry=%s error=%s", task_id, worker.id, retry, message)
        return worker.calls.fail(task_id, token, message, retry=retry)
    finally:
        if res is not None:
            worker.cache.release(res)
        worker.untrack(task_id)


SETTLED = {"ack": "succeeded", "requeue": "yielded"}  # fail: "delayed" is a retry


def settle(worker: Worker, call: Call[Any], reply: Any) -> None:
    """Check the reply of an ack, fail or yield; a stale token means another attempt owns
    the task."""
    task_id = call.args[0]
    try:
        done = call.parse(reply)
    except StaleLease:
        worker.observe(task_id, "lost")
        log.warning("lease.lost task=%s worker=%s: %s discarded", task_id, worker.id,
                    "result" if call.script == "ack" else "failure")
    except GpuqError as exc:  # e.g. a result the server would not take: the lease runs out
        worker.observe(task_id, "lost")
        log.error("task.settle_failed task=%s worker=%s error=%s", task_id, worker.id, exc)
    else:
        outcome = SETTLED.get(call.script) or ("retried" if done == "delayed" else "failed")
        worker.observe(task_id, outcome)
