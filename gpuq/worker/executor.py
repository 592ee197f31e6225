"""Runs one claimed task: load its model if cold, call its handler, ack or fail it (fenced)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuq import catalog
from gpuq.app import Context
from gpuq.errors import GpuqError, StaleLease
from gpuq.scripts import Call
from gpuq.task import JSON
from gpuq.worker import presence
from gpuq.worker.models import Reservation

if TYPE_CHECKING:
    from gpuq.worker.loop import Worker

log = logging.getLogger(__name__)


@dataclass
class Running:
    task_id: str
    token: int
    ctx: Context
    started: float


class TaskError(Exception):
    """A failure the worker diagnoses itself; retry says whether another attempt may help."""

    def __init__(self, message: str, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


def prepare_model(worker: Worker, res: Reservation) -> Any:
    """Unload what must make room, load the model if this task is the one to, return it."""
    cache = worker.cache
    resident = cache.get(res.model)
    if res.cold:
        pipe = worker.redis.pipeline(transaction=False)
        for old in res.evict:
            cache.unload(old)
            presence.hold(pipe, worker.keys, worker.id, old.spec.name, False)
            log.info("model.evicted worker=%s model=%s", worker.id, old.spec.name)
        pipe.execute()  # before the load: until then wake-ups would still pick this worker
        try:
            seconds = cache.load(resident)
        except Exception as exc:
            raise TaskError(f"loading model {res.model} failed: {type(exc).__name__}: {exc}",
                            True) from None
        catalog.record_load(pipe, worker.keys, res.model, resident.footprint_gb, seconds)
        presence.hold(pipe, worker.keys, worker.id, res.model, True)
        with cache.lock:  # other runners may be changing the ledger
            shown: presence.Fields = {"models": ",".join(cache.model_names()),
                                      "vram_free_gb": round(cache.free_gb(), 3)}
        pipe.hset(worker.keys.worker(worker.id), mapping=shown)
        pipe.execute()
        worker.model_loads += 1
        log.info("model.loaded worker=%s model=%s vram_gb=%g load_s=%.3f", worker.id, res.model,
                 resident.footprint_gb, seconds)
    else:
        resident.ready.wait()
        if resident.error is not None:
            raise TaskError(f"loading model {res.model} failed: {resident.error}", True)
    return resident.obj


def execute(worker: Worker, fields: dict[str, str], res: Reservation | None,
            running: Running) -> Call[Any]:
    """Run the task; return its ack or fail call, which the runner sends together with its
    next claim (one round trip per task). The task's VRAM and slot are released first."""
    task_id, token, ctx = running.task_id, running.token, running.ctx
    try:
        problem = worker.app.check(fields["handler"], fields["model"])
        if problem:
            raise TaskError(problem, False)
        if res is None:
            raise TaskError(f"task needs {fields['vram_gb']} GB with model {fields['model']}, "
                            f"more than this GPU can free", True)
        model = prepare_model(worker, res)
        result = worker.app.handlers[fields["handler"]].fn(model, json.loads(fields["payload"]), ctx)
        try:
            text = JSON.encode(result)
        except (TypeError, ValueError) as exc:
            raise TaskError(f"handler returned a result that is not JSON: {exc}", False) from None
        return worker.calls.ack(task_id, token, text)
    except Exception as exc:
        retry = exc.retry if isinstance(exc, TaskError) else True
        message = str(exc) if isinstance(exc, TaskError) else f"{type(exc).__name__}: {exc}"
        log.info("task.failed task=%s worker=%s retry=%s error=%s", task_id, worker.id, retry, message)
        return worker.calls.fail(task_id, token, message, retry=retry)
    finally:
        if res is not None:
            worker.cache.release(res)
        worker.untrack(task_id)


def settle(worker: Worker, call: Call[Any], reply: Any) -> None:
    """Check the reply of an ack or fail; a stale token means another attempt owns the task."""
    try:
        call.parse(reply)
    except StaleLease:
        log.warning("lease.lost task=%s worker=%s: %s discarded", call.args[0], worker.id,
                    "result" if call.script == "ack" else "failure")
    except GpuqError as exc:  # e.g. a result the server would not take: the lease runs out
        log.error("task.settle_failed task=%s worker=%s error=%s", call.args[0], worker.id, exc)
