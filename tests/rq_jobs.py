"""RQ job functions for the rq interop tests (workers allow them with --rq-allow tests.rq_jobs)."""

from __future__ import annotations

import string
from typing import Any

from gpuq.rq import current_context, current_model


def add(a: int, b: int) -> int:
    return a + b


def boom(message: str) -> None:
    raise ValueError(message)


def which_model() -> dict[str, Any]:
    """What the worker loaded for this job, seen through gpuq.rq's accessors."""
    context = current_context()
    return {"model": current_model().name, "task": context.ctx.task_id, "job": context.job.id}


def leave() -> None:
    raise SystemExit(3)


def canceled_while_running(stop: bool) -> int:
    """As if its gpuq task were canceled while it ran (``on_cancel``: the test's cancel, and
    the bridge's pass that tells RQ), its lease lost (what the worker's heartbeat sets); then,
    with ``stop``, stopped as the worker stops a lost run past the grace, else it returns a
    value all the same."""
    from gpuq.errors import StopTask

    ctx = current_context().ctx
    on_cancel[0](ctx.task_id)
    ctx.lost = True
    if stop:
        raise StopTask()
    return 7


on_cancel: list[Any] = []  # set by the test before the job runs



class Notes(string.Template):
    """An object of an allowed module whose class inherits methods from outside it (from
    string.Template, pure Python: RQ calls them as its methods): only its own may run."""

    def count(self) -> int:
        return len(self.template)
