"""The ``rq.job`` handler: runs an RQ job's function inside a gpuq worker, on the task's model.

The task's payload names the RQ job (``{"rq_job": id, "rq_queue": name}``); the worker reads
the job from RQ's Redis through the restricted unpickler, checks its function against the
worker's allowlist, calls it with ``current_model()`` set, and writes the outcome back in RQ's
format. A job refused here (function not allowed, forged pickle) fails at once, without retry.

Retries: a function that raises fails the gpuq attempt; gpuq retries it (backoff) while
attempts are left, the RQ job showing ``queued`` meanwhile; only the last failed attempt marks
the RQ job failed, so RQ sees one outcome per enqueue.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

import redis
from rq.exceptions import DeserializationError, NoSuchJobError
from rq.job import Job, JobStatus
from rq.utils import import_attribute

from gpuq.app import App, Context, HandlerSpec, Yielded
from gpuq.errors import StopTask, TaskError
from gpuq.keys import Keys
from gpuq.rq import outcome
from gpuq.rq.context import RqContext, running
from gpuq.rq.fields import HANDLER, JobRefused
from gpuq.rq.unpickle import Allowlist, ForbiddenGlobal, RestrictedSerializer

log = logging.getLogger(__name__)


class RqHandler:
    def __init__(self, allow: Allowlist, rq_redis: redis.Redis, pool: redis.Redis, keys: Keys) -> None:
        self.allow = allow
        self.rq = rq_redis
        self.pool = pool  # gpuq's Redis: a failing attempt reads the task's attempt budget
        self.keys = keys

    def __call__(self, model: Any, payload: Any, ctx: Context) -> Any:
        job = self.fetch(payload)
        try:
            self.check(job)
        except JobRefused as exc:
            log.warning("rq.refused job=%s task=%s reason=%s", job.id, ctx.task_id, exc.reason)
            outcome.failed(job, str(exc), ctx.worker_id)
            raise TaskError(str(exc), False) from None
        status = job.get_status(refresh=False)
        if status in (JobStatus.CANCELED, JobStatus.STOPPED):
            # canceled through RQ's API after the bridge moved it: it must not run
            raise TaskError(f"rq job {job.id} was {status.value} in RQ", False)
        outcome.started(job, ctx.worker_id)
        try:
            with running(RqContext(model, ctx, job)):
                value = job.perform()
        except Yielded:  # gave way to other work: the worker queues the task again
            outcome.queued_again(job)
            raise
        except StopTask:  # stopped: requeued by the worker (past a yield deadline), or its
            # lease lost (canceled: the bridge gives RQ that end; taken back: its next run's)
            if self.state(ctx) in ("queued", "delayed"):
                outcome.queued_again(job)
            raise
        except (Exception, SystemExit):  # RQ's worker fails a job that calls sys.exit() too
            if self.last_attempt(ctx):
                outcome.failed(job, traceback.format_exc(), ctx.worker_id)
            else:
                outcome.retrying(job)
            raise
        if ctx.should_stop():  # canceled or taken back as it ran: its result is not the job's
            log.warning("rq.discarded job=%s task=%s: the task's run was canceled or taken back",
                        job.id, ctx.task_id)
            return {"rq_job": job.id, "status": "discarded"}
        try:
            outcome.finished(job, value, ctx.worker_id)
        except (TypeError, ValueError, AttributeError) as exc:  # RQ's serializer refused it
            message = f"rq job {job.id} returned a value RQ cannot store: {type(exc).__name__}: {exc}"
            outcome.failed(job, message, ctx.worker_id)
            raise TaskError(message, False) from None
        return {"rq_job": job.id, "status": "finished"}

    def state(self, ctx: Context) -> str | None:
        value = self.pool.hget(self.keys.task(ctx.task_id), "state")
        return None if value is None else str(value)

    def last_attempt(self, ctx: Context) -> bool:
        budget = self.pool.hget(self.keys.task(ctx.task_id), "max_attempts")
        return ctx.attempt >= int(budget or 1)

    def fetch(self, payload: Any) -> Job:
        job_id = payload.get("rq_job") if isinstance(payload, dict) else None
        if not isinstance(job_id, str) or not job_id:
            raise TaskError(f"payload {payload!r} does not name an rq job", False)
        try:
            return Job.fetch(job_id, connection=self.rq, serializer=RestrictedSerializer(self.allow))
        except NoSuchJobError:
            raise TaskError(f"rq job {job_id} no longer exists in RQ's Redis", False) from None
        except redis.RedisError:
            raise
        except Exception as exc:  # a damaged job hash (RQ raises what its parsers raise)
            raise TaskError(f"rq job {job_id} is unreadable in RQ's Redis: {type(exc).__name__}: "
                            f"{exc}", False) from None

    def check(self, job: Job) -> None:
        """JobRefused unless the job's call reads through the restricted unpickler and names an
        allowed function (or a method of an object of an allowed class)."""
        try:
            name = job.func_name  # reads the pickled call: a forbidden global stops here
            instance = job.instance
        except DeserializationError as exc:
            cause = exc.__cause__
            reason = str(cause) if isinstance(cause, ForbiddenGlobal) else f"unreadable job data ({cause})"
            raise JobRefused(job.id, reason) from None
        if instance is not None:
            owner = type(instance).__module__
            if not self.allow.admits(owner):
                raise JobRefused(job.id, f"method of {owner} is not in the worker's rq allowlist")
            # defined by a class of the allowlist, not inherited from outside it (a subclass of
            # pathlib's Path would lend its write_text), and no dunder
            definer = next((c.__module__ for c in type(instance).__mro__ if name and name in vars(c)), "")
            if not name or name.startswith("__") or not self.allow.admits(definer):
                raise JobRefused(job.id, f"method {name} of {owner}.{type(instance).__qualname__} is "
                                         "defined outside the worker's rq allowlist")
            return
        if not name or not self.allow.admits(name):
            raise JobRefused(job.id, f"function {name} is not in the worker's rq allowlist "
                                     f"({', '.join(self.allow.modules)}; see --rq-allow)")
        try:
            func = import_attribute(name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise JobRefused(job.id, f"cannot import {name}: {exc}") from None
        # a name may walk through an allowed module to something it imported (mod.os.system)
        if not self.allow.admits(getattr(func, "__module__", None) or ""):
            raise JobRefused(job.id, f"{name} is defined outside the worker's rq allowlist")


def install(app: App, allow: Allowlist, rq_redis: redis.Redis, pool: redis.Redis, keys: Keys) -> None:
    """Register the rq handler in this worker's app (any model the app has a loader for)."""
    app.handlers[HANDLER] = HandlerSpec(HANDLER, RqHandler(allow, rq_redis, pool, keys), None)
    log.info("rq.enabled app=%s allow=%s", app.name, ",".join(allow.modules))
