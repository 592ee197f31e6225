"""What an RQ job function may ask of the gpuq worker running it (like rq's get_current_job).

A job function keeps RQ's signature (its own args), so the model and the task's context reach
it through a per-thread slot the rq handler fills around the call: each runner thread runs one
task at a time.

    from gpuq.rq import current_model

    def generate(prompt):
        return current_model().generate(prompt)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gpuq.app import Context
from gpuq.errors import GpuqError


@dataclass(frozen=True)
class RqContext:
    model: Any  # the task's model, loaded by the worker app's loader
    ctx: Context  # the gpuq task context: task id, attempt, should_stop(), should_yield()
    job: Any  # the rq.job.Job being run


_slot = threading.local()


class NoCurrentJob(GpuqError):
    def __init__(self) -> None:
        super().__init__("no RQ job is running in this thread under a gpuq worker")


def current_context() -> RqContext:
    """The running job's context; NoCurrentJob outside a gpuq worker's rq handler."""
    found: RqContext | None = getattr(_slot, "current", None)
    if found is None:
        raise NoCurrentJob()
    return found


def current_model() -> Any:
    """The model the worker loaded for the running job."""
    return current_context().model


@contextmanager
def running(context: RqContext) -> Iterator[None]:
    _slot.current = context
    try:
        yield
    finally:
        _slot.current = None
