"""A worker app with batch handlers, for the worker tests (``--app tests.batch_app:app``)."""

from __future__ import annotations

from typing import Any

from gpuq.app import App, BatchContext

app = App("batch")


@app.any_model()
def load(name: str) -> str:
    return name


@app.handler("batch.echo", batch=4, batch_wait_ms=50)
def echo(model: str, payloads: list[Any], ctx: BatchContext) -> list[Any]:
    """Each task's payload back, with its own task id and attempt, and the batch's size."""
    return [{"echo": p, "task": c.task_id, "attempt": c.attempt, "batch": len(payloads), "model": model}
            for p, c in zip(payloads, ctx.contexts)]


@app.handler("batch.short", batch=4)
def short(model: str, payloads: list[Any], ctx: BatchContext) -> list[Any]:
    """One result too few."""
    return payloads[1:]
