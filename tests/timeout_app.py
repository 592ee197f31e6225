"""A worker app whose handlers run past their ``timeout_s``, for the worker tests
(``--app tests.timeout_app:app``)."""

from __future__ import annotations

import time
from typing import Any

from gpuq.app import App, Context

app = App("timeouts")


@app.any_model()
def load(name: str) -> str:
    return name


@app.handler("slow.sleep", timeout_s=1)
def sleep(model: str, payload: Any, ctx: Context) -> str:
    """Sleeps a minute in short steps, never checking should_stop(): StopTask ends it."""
    until = time.monotonic() + 60
    while time.monotonic() < until:
        time.sleep(0.05)
    return "slept"


@app.handler("slow.spin", timeout_s=1)
def spin(model: str, payload: Any, ctx: Context) -> str:
    """A busy loop that ignores should_stop() and swallows every exception, StopTask too:
    nothing in-process stops it."""
    while True:
        try:
            while True:
                pass
        except BaseException:  # the point: a handler that will not stop
            continue


@app.handler("slow.quick", timeout_s=1)
def quick(model: str, payload: Any, ctx: Context) -> Any:
    return payload
