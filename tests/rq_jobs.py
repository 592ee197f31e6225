"""RQ job functions for the rq interop tests (workers allow them with --rq-allow tests.rq_jobs)."""

from __future__ import annotations

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
