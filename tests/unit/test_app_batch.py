"""Batch handlers in an App: their settings checked at registration, their context."""

from __future__ import annotations

from typing import Any

import pytest

from gpuq.app import MAX_BATCH, App, BatchContext, Context, Yielded
from gpuq.errors import AppError


def echo(model: Any, payloads: list[Any], ctx: BatchContext) -> list[Any]:
    return payloads


def test_a_batch_handler_is_registered_with_its_settings() -> None:
    app = App("a")
    assert app.handler("embed", model="bge-m3", batch=32, batch_wait_ms=20)(echo) is echo
    spec = app.handlers["embed"]
    assert (spec.batch, spec.batch_wait_ms, spec.model, spec.fn) == (32, 20.0, "bge-m3", echo)
    app.handler("one")(lambda model, payload, ctx: payload)
    assert (app.handlers["one"].batch, app.handlers["one"].batched) == (1, False)
    app.handler("size-one", batch=1)(echo)  # a size from settings: still lists of payloads
    assert (app.handlers["size-one"].batch, app.handlers["size-one"].batched) == (1, True)
    app.handler("edge", batch=MAX_BATCH, batch_wait_ms=0.5)(echo)


@pytest.mark.parametrize("batch", [0, -1, 2.0, "4", True, MAX_BATCH + 1])
def test_batch_must_be_an_integer_from_one(batch: Any) -> None:
    with pytest.raises(AppError) as err:
        App("a").handler("embed", batch=batch)
    assert str(err.value) == (f"handler 'embed': batch must be an integer from 1 to {MAX_BATCH}, "
                              f"got {batch!r}")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("wait", [-1, -0.5, float("nan"), float("inf"), "20", True, None])
def test_batch_wait_must_be_ms_from_zero(wait: Any) -> None:
    app = App("a")
    with pytest.raises(AppError, match=r"^handler 'embed': batch_wait_ms must be a number of ms >= 0, got "):
        app.handler("embed", batch=4, batch_wait_ms=wait)
    assert "embed" not in app.handlers


def contexts(n: int) -> list[Context]:
    return [Context(f"t{i}", 1, "w", "m", 4, 1) for i in range(n)]


def test_the_batch_context_speaks_for_the_batch() -> None:
    each = contexts(3)
    ctx = BatchContext(each)
    assert (ctx.task_ids, ctx.worker_id, ctx.model) == (["t0", "t1", "t2"], "w", "m")
    assert not ctx.should_yield() and not ctx.should_stop()
    each[1].yield_requested = True  # one task asked to give way: the batch yields
    assert ctx.should_yield() and not ctx.should_stop()
    each[1].yield_requested = False
    each[0].lost = each[1].lost = True  # one task still delivers: keep going
    assert not ctx.should_stop() and not ctx.should_yield()
    each[2].lost = True
    assert ctx.should_stop() and ctx.should_yield()
    with pytest.raises(Yielded):
        ctx.yield_now()
