"""Apps: the registry of models (loaders) and handlers a worker may run.

A worker runs only handlers registered in its app, so whoever can write to Redis still
cannot make it execute arbitrary code; payloads are JSON, never pickle.

    app = gpuq.App("llm")

    @app.model("llama3-8b", vram_gb=16)
    def load_llama(name): return load_weights(name)

    @app.handler("llm.generate", model="llama3-8b")
    def generate(model, payload, ctx): return {"text": model.generate(payload["prompt"])}
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

from gpuq.errors import AppError
from gpuq.task import JSON

Loader = Callable[[str], Any]
Unloader = Callable[[Any], None]


class Yielded(Exception):
    """Raised through ``Context.yield_now``: the task gives its GPU back and is requeued,
    with its checkpoint, without using up an attempt."""


class Context:
    """What a handler may ask of the worker while it runs."""

    def __init__(self, task_id: str, attempt: int, worker_id: str, model: str,
                 vram_gb: float, est_s: float, checkpoint: Any = None) -> None:
        self.task_id = task_id
        self.attempt = attempt
        self.worker_id = worker_id
        self.model = model
        self.vram_gb = vram_gb
        self.est_s = est_s
        self.checkpoint = checkpoint  # what an earlier, preempted run saved (None: none)
        # plain flags set by the worker's heartbeat thread (an Event per task would cost a
        # lock and a condition on the hot path)
        self.lost = False  # lease lost, task canceled, or stopped past its yield deadline
        self.yield_requested = False  # a higher-priority task waits for this GPU
        self.saved: str | None = None  # checkpoint JSON text to hand to the next run

    def should_stop(self) -> bool:
        """True once the task's lease is lost or it was canceled: its result will be rejected."""
        return self.lost

    def should_yield(self) -> bool:
        """True once the preemption planner asked this task to give way. A handler that can,
        saves a checkpoint and calls ``yield_now``; one that ignores it is stopped at the
        yield deadline and requeued all the same."""
        return self.yield_requested or self.lost

    def save_checkpoint(self, state: Any) -> None:
        """Keep JSON-able state for the task's next run (``ctx.checkpoint`` there)."""
        self.saved = JSON.encode(state)

    def yield_now(self, state: Any = None) -> NoReturn:
        """Give the GPU back now: requeue the task (attempt not used), with ``state`` as its
        checkpoint if given (else the last one saved)."""
        if state is not None:
            self.save_checkpoint(state)
        raise Yielded(self.task_id)


class Handler(Protocol):
    def __call__(self, model: Any, payload: Any, ctx: Context) -> Any: ...


@dataclass(frozen=True)
class ModelSpec:
    name: str
    vram_gb: float | None  # None: the footprint is the VRAM the task declares
    load: Loader
    unload: Unloader | None = None

    def footprint(self, task_vram_gb: float) -> float:
        return self.vram_gb if self.vram_gb is not None else task_vram_gb


@dataclass(frozen=True)
class HandlerSpec:
    name: str
    fn: Handler
    model: str | None  # None: runs with whatever model the task names


@dataclass
class App:
    name: str
    models: dict[str, ModelSpec] = field(default_factory=dict)
    handlers: dict[str, HandlerSpec] = field(default_factory=dict)
    fallback: ModelSpec | None = None  # serves model names not registered by name
    # module prefixes whose RQ job functions this app's workers may run (gpuq.rq; the
    # worker's --rq-allow adds to it); empty: no RQ jobs
    rq_allow: list[str] = field(default_factory=list)

    def model(self, name: str, *, vram_gb: float | None = None,
              unload: Unloader | None = None) -> Callable[[Loader], Loader]:
        def register(load: Loader) -> Loader:
            self.models[name] = ModelSpec(name, vram_gb, load, unload)
            return load
        return register

    def any_model(self, *, unload: Unloader | None = None) -> Callable[[Loader], Loader]:
        """Register a loader for any model name (its footprint is the task's VRAM)."""
        def register(load: Loader) -> Loader:
            self.fallback = ModelSpec("*", None, load, unload)
            return load
        return register

    def handler(self, name: str, *, model: str | None = None) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            self.handlers[name] = HandlerSpec(name, fn, model)
            return fn
        return register

    def model_spec(self, name: str) -> ModelSpec | None:
        spec = self.models.get(name)
        if spec is None and self.fallback is not None:
            spec = ModelSpec(name, None, self.fallback.load, self.fallback.unload)
        return spec

    def check(self, handler: str, model: str) -> str | None:
        """Why this app cannot run (handler, model), or None if it can."""
        spec = self.handlers.get(handler)
        if spec is None:
            return f"handler {handler!r} is not registered in app {self.name!r}"
        if spec.model is not None and spec.model != model:
            return f"handler {handler!r} runs model {spec.model!r}, task names {model!r}"
        if self.model_spec(model) is None:
            return f"model {model!r} has no loader in app {self.name!r}"
        return None


def load_app(path: str) -> App:
    """Import ``module:attr`` and return the App it names."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise AppError(f"--app must look like module:attr, got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppError(f"cannot import app module {module_name!r}: {exc}") from None
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise AppError(f"{path} is not a gpuq.App")
    return app
