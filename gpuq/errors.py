"""The exceptions of gpuq; everything derives from GpuqError and builds its own message."""

from __future__ import annotations

from typing import Any

from gpuq.redact import redact, redact_url


class GpuqError(Exception):
    """Base of every gpuq error."""


class InvalidTask(GpuqError):
    """A task was rejected at the boundary; nothing was written."""

    def __init__(self, reason: str, task_id: str | None = None) -> None:
        self.reason = reason
        self.task_id = task_id
        super().__init__(f"invalid task: {reason}")


class DuplicateTask(GpuqError):
    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"task {task_id} already exists")


class Unschedulable(GpuqError):
    """check_fit: no registered GPU class could ever hold the task. largest_gb: the largest
    class with at least the task's GPUs; most_gpus: the most GPUs of any class's group."""

    def __init__(self, vram_gb: float, largest_gb: float, gpus: int = 1, most_gpus: int = 1, *,
                 where: str = "") -> None:
        self.vram_gb = vram_gb
        self.largest_gb = largest_gb
        self.gpus = gpus
        self.most_gpus = most_gpus
        if gpus > 1 and largest_gb <= 0 and most_gpus > 0:  # where: "task <i> of the batch: "
            super().__init__(f"unschedulable: {where}task needs {gpus} GPUs, the largest GPU group "
                             f"registered in this pool has {most_gpus}")
            return
        on, of = (f" on {gpus} GPUs", f" of {gpus}+ GPUs") if gpus > 1 else ("", "")
        offer = (f"the largest registered GPU class{of} offers {largest_gb:g} GB" if largest_gb > 0
                 else "no GPU class is registered in this pool yet")
        super().__init__(f"unschedulable: {where}task needs {vram_gb:g} GB of VRAM{on}, {offer}")


class UnregisteredHandler(Unschedulable):
    """check_fit: no worker of the pool has ever registered the task's handler (a typo, or
    an app that was never started here)."""

    def __init__(self, handler: str, *, where: str = "") -> None:
        self.handler = handler
        self.vram_gb = self.largest_gb = 0.0
        GpuqError.__init__(self, f"unschedulable: {where}no worker in this pool registers handler "
                                 f"{handler!r}")


class CorruptTask(GpuqError):
    """A stored task hash that cannot be read back (damaged, or written by hand)."""

    def __init__(self, task_id: str, reason: str) -> None:
        self.task_id = task_id
        self.reason = reason
        super().__init__(f"task {task_id} is stored corrupt: {reason}")


class TaskNotFound(GpuqError):
    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"task {task_id} not found")


class StaleLease(GpuqError):
    """An ack, fail or requeue came from a worker whose lease was lost (fencing token)."""

    def __init__(self, task_id: str, worker_id: str | None = None) -> None:
        self.task_id = task_id
        self.worker_id = worker_id
        super().__init__(f"stale lease on task {task_id}: its lease was lost or it was canceled")


class TaskAlreadyFinished(GpuqError):
    def __init__(self, task_id: str, state: str) -> None:
        self.task_id = task_id
        self.state = state
        super().__init__(f"task {task_id} already ended ({state})")


class PartialEnqueue(GpuqError):
    """A bulk enqueue of several calls stopped after some of them: ``enqueued`` holds the
    handles of the tasks stored (they stand and will run), ``cause`` what stopped the rest
    (gpuq.bulk)."""

    def __init__(self, enqueued: list[Any], total: int, cause: BaseException) -> None:
        self.enqueued = enqueued
        self.cause = cause
        super().__init__(f"bulk enqueue stopped: {len(enqueued)} of {total} tasks were enqueued "
                         f"(they stand: see .enqueued), the rest not: {cause}")


class TaskFailed(GpuqError):
    """Raised by result() when the task ended in a state other than succeeded."""

    def __init__(self, task_id: str, state: str, error: str) -> None:
        self.task_id = task_id
        self.state = state
        self.error = error
        # a plain cancel's error is its state's name: said once
        said = error and error != state
        super().__init__(f"task {task_id} {state}: {error}" if said else f"task {task_id} {state}")


class ResultTimeout(GpuqError):
    def __init__(self, task_id: str, timeout: float) -> None:
        self.task_id = task_id
        self.timeout = timeout
        super().__init__(f"task {task_id} did not finish within {timeout:g} s")


class ConfigError(GpuqError):
    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"configuration: {reason}")


class ConnectionFailed(GpuqError):
    """Redis could not be used at all. The URL in the message (and in ``url``) has its
    password masked; subclasses say why when the reason is known."""

    what = "cannot reach Redis at {url}"

    def __init__(self, url: str, cause: str) -> None:
        self.url = redact_url(url)
        self.cause = redact(cause)
        super().__init__(f"{self.what.format(url=self.url)}: {self.cause}")


class AuthenticationFailed(ConnectionFailed):
    """Wrong user name or password, or a server that wants one (WRONGPASS, NOAUTH)."""

    what = "authentication failed for Redis at {url}"


class TlsFailed(ConnectionFailed):
    """The TLS handshake failed: an unknown CA, a wrong host name, a missing client
    certificate, or TLS spoken to a plain port."""

    what = "TLS handshake with Redis at {url} failed"


class NoMaster(ConnectionFailed):
    """No Sentinel answered with a master for the URL's master name."""

    what = "no master from the Sentinels at {url}"


class ServerRefused(ConnectionFailed):
    """The server answered but cannot serve gpuq: a read-only replica, or out of memory."""

    what = "Redis at {url} refused the command"


class ReplicaTimeout(GpuqError):
    """A write the master made, acknowledged by fewer replicas than ``replica_acks`` asks
    within ``replica_wait_ms``: it stands on the master, but a failover before the master
    replicates it would lose it."""

    def __init__(self, what: str, acked: int, wanted: int, timeout_ms: int) -> None:
        self.what = what
        self.acked = acked
        self.wanted = wanted
        super().__init__(f"{what} is written on the master, but only {acked} of {wanted} replicas "
                         f"acknowledged it within {timeout_ms} ms: it may be lost in a failover")


class PermissionDenied(GpuqError):
    """The server's ACL refused a command or a key to this connection's user (NOPERM)."""

    def __init__(self, url: str, cause: str) -> None:
        self.url = redact_url(url)
        self.cause = redact(cause)
        super().__init__(f"Redis at {self.url} refused a command to this user: {self.cause} "
                         "(the ACL rules each role needs: gpuq acl --help)")


class TaskError(GpuqError):
    """Raised by a handler (or by the worker about a task) to fail the task with this
    message; ``retry=False`` fails it at once, without another attempt:
    ``raise TaskError("bad input", retry=False)``."""

    def __init__(self, message: str, retry: bool = True) -> None:
        self.retry = retry
        super().__init__(message)


class ModelLoadFailed(TaskError):
    """The worker could not load a task's model: its loader raised (``cause``, one line).
    Retryable; the worker may pass the task on instead (gpuq.worker.broken)."""

    def __init__(self, model: str, cause: str) -> None:
        self.model = model
        self.cause = cause
        super().__init__(f"loading model {model} failed: {cause}", True)


class EmitError(GpuqError):
    """A handler's ``ctx.emit`` chunk or ``ctx.progress`` report that cannot be sent: not
    JSON, larger than ``stream_chunk_max_bytes``, or a fraction outside 0..1. Nothing was
    written; the task keeps running."""

    def __init__(self, reason: str, task_id: str | None = None) -> None:
        self.reason = reason
        self.task_id = task_id
        super().__init__(f"task {task_id}: {reason}" if task_id else reason)


class StopTask(Exception):
    """Raised inside a handler's thread when it ran past its yield deadline. Not a
    GpuqError: a handler's ``except GpuqError`` around its own queue calls must not
    swallow it."""


class AppError(GpuqError):
    """An app (handlers and model loaders) is missing, malformed or lacks a handler."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class WorkerNotFound(GpuqError):
    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        super().__init__(f"worker {worker_id} is not live in this pool")


class NotRequeueable(GpuqError):
    """An operator requeue of a task that is queued or succeeded."""

    def __init__(self, task_id: str, reason: str) -> None:
        self.task_id = task_id
        self.reason = reason
        super().__init__(f"cannot requeue task {task_id}: {reason}")


class TenantError(GpuqError):
    """A tenant setting refused: a malformed name, weight or cap, or an unknown tenant."""


class ScheduleError(GpuqError):
    """A periodic task was refused (bad name, interval or cron expression, or no such
    schedule); nothing was stored or removed."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"schedule: {reason}")


class BadTenant(TenantError):
    """A tenant setting malformed (its name, weight or a cap): refused before anything is sent."""


class BadSchedule(ScheduleError):
    """A schedule malformed (its name, interval, cron expression or options), or whose task
    enqueue would refuse (a tenant not registered where the pool requires it): refused
    before anything is stored."""
