"""Apps: the registry of models (loaders) and handlers a worker may run.

A worker runs only handlers registered in its app, so whoever can write to Redis still
cannot make it execute arbitrary code; payloads are JSON, never pickle.

    app = gpuq.App("llm")

    @app.model("llama3-8b", vram_gb=16)
    def load_llama(name): return load_weights(name)

    @app.handler("llm.generate", model="llama3-8b")
    def generate(model, payload, ctx): return {"text": model.generate(payload["prompt"])}

    @app.handler("embed", model="bge-m3", batch=32, batch_wait_ms=20)
    def embed(model, payloads, ctx): return [model.encode(p["text"]) for p in payloads]

A batch handler (registered with a ``batch`` size, 1 too) gets the payloads of up to
``batch`` tasks of its handler and model, claimed together (gpuq/lua/claim_batch.lua), and
returns one result per task, in
order (an exception in a task's place fails that task alone); each task keeps its own
lease, attempt, result and retry (``gpuq.worker.batch``).

A handler (or loader, or unloader) may be ``async def``: it runs on the worker's event loop
(``gpuq.worker.eventloop``), so the ``--concurrency N`` tasks of a worker share one loaded
model on one loop, e.g. an engine that batches the requests arriving while it runs a step:

    @app.handler("llm.chat", model="llama3-8b")
    async def chat(engine, payload, ctx): return {"text": await engine.generate(payload)}

An async task stopped at its yield deadline has its asyncio task cancelled
(CancelledError at its current await); everything else (yields, retries, leases) is as for a
blocking handler. Blocking and async handlers mix freely in one app.

``timeout_s`` bounds a handler call (a batch's one call), not its model's load: past it the
task fails, retryable, with "ran past its 30 s timeout", its handler sees ``should_stop()``
and is stopped as a run whose lease is gone (gpuq.worker.control):

    @app.handler("llm.generate", model="llama3-8b", timeout_s=30)
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, TypeVar

from gpuq.errors import AppError, InvalidTask, StaleLease
from gpuq.names import name_problem
from gpuq.stream import Memory, Sink
from gpuq.task import JSON, MAX_CHECKPOINT_BYTES, MAX_VRAM_GB, positive_number

_SINK_MADE = threading.Lock()  # a Context's sink is made once (rare: most runs emit nothing)
Loader = Callable[[str], Any]  # may be async def
Unloader = Callable[[Any], Any]  # may be async def
MAX_BATCH = 10_000  # claim_batch.lua takes at most this many tasks a call


class Yielded(BaseException):
    """Raised through ``Context.yield_now``: the task gives its GPU back and is requeued, with
    its checkpoint, its attempt unused. A BaseException, as asyncio's cancellation is: an
    ``except Exception`` lets it through (one that catches it gives way all the same)."""


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
        self.yielding = False  # yield_now was called: the run gives way however the handler ends
        self.saved: str | None = None  # checkpoint JSON text to hand to the next run
        # where emit and progress go: the worker sets how to make the task's
        # gpuq.stream.Emitter (new_sink); a Context made elsewhere (gpuq.testing, a handler's
        # tests) keeps them in a Memory
        self.sink: Sink | None = None
        self.new_sink: Callable[[], Sink] | None = None

    def emit(self, value: Any) -> None:
        """Send a chunk (any JSON value) to the task's stream now: producers reading
        ``task.stream()`` get it as it comes (one round trip; gpuq.stream). EmitError for a
        value that is not JSON or larger than ``stream_chunk_max_bytes`` (nothing sent);
        StaleLease once the lease is lost: nothing is appended, and should_stop() turns true."""
        try:
            self._sink().emit(value)
        except StaleLease:
            self.lost = True
            raise

    def progress(self, fraction: float, message: str = "") -> None:
        """Report how far the task is: ``fraction`` from 0 to 1 and a short message (at most
        200 characters), shown by ``gpuq task`` and ``gpuq top`` and read by
        ``task.progress()``. EmitError for bad values; StaleLease as for ``emit``."""
        try:
            self._sink().progress(fraction, message)
        except StaleLease:
            self.lost = True
            raise

    def _sink(self) -> Sink:
        if self.sink is None:
            with _SINK_MADE:  # two threads' first chunks must share one sink (its numbering)
                if self.sink is None:
                    self.sink = Memory() if self.new_sink is None else self.new_sink()
        return self.sink

    def should_stop(self) -> bool:
        """True once the task's lease is lost or it was canceled: its result will be rejected."""
        return self.lost

    def should_yield(self) -> bool:
        """True once the preemption planner asked this task to give way, or the worker's
        shutdown did (its grace nearly out), and once should_stop() is (canceled, lease
        lost: the handler may as well end). A handler that can, saves a checkpoint and
        calls ``yield_now``; one that ignores it is stopped at the yield deadline (given
        back at the shutdown grace's end) and requeued all the same."""
        return self.yield_requested or self.lost

    def save_checkpoint(self, state: Any) -> None:
        """Keep JSON-able state for the task's next run (``ctx.checkpoint`` there) after this
        one gives way: a yield, a stop, the worker's shutdown (it goes with their requeue; a
        retry after the handler raised starts without it). At most 1 MiB of JSON, as the
        server takes with a requeue; InvalidTask for more, or for a value that is not JSON
        (nothing kept)."""
        if isinstance(state, (bytes, bytearray)):  # JSON's own message would not say where
            raise InvalidTask("checkpoint must be JSON-serializable data, not bytes")
        try:
            text = JSON.encode(state)
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidTask(f"checkpoint is not JSON-serializable: {exc}") from None
        if len(text) > MAX_CHECKPOINT_BYTES:  # the requeue would be refused: the yield lost
            raise InvalidTask(f"checkpoint of {len(text)} bytes is more than the "
                              f"{MAX_CHECKPOINT_BYTES} allowed: keep large state elsewhere")
        self.saved = text

    def yield_now(self, state: Any = None) -> NoReturn:
        """Give the GPU back now: requeue the task (attempt not used), with ``state`` as its
        checkpoint if given (else the last one saved)."""
        if state is not None:
            self.save_checkpoint(state)
        self.yielding = True
        raise Yielded(self.task_id)


class BatchContext:
    """What a batch handler may ask of the worker, for the batch. ``contexts`` holds each
    task's own Context, in payload order (its task id, attempt, checkpoint; a handler that
    can resume saves each task's checkpoint there).

    A batch handler streams per task: ``ctx.contexts[i].emit(chunk)`` and
    ``ctx.contexts[i].progress(...)`` (each task has its own stream, lease and progress).

    ``should_stop()`` turns true once no task of the batch can deliver a result any more
    (every lease lost or task stopped); ``should_yield()`` once one task of the batch was asked
    to give way (or should_stop). ``yield_now()`` gives every task of the batch back, attempts
    not used, each with its own saved checkpoint; a handler that ignores the request is
    stopped at the yield deadline, the asked task requeued and the others given back."""

    def __init__(self, contexts: list[Context]) -> None:
        self.contexts = contexts
        self.worker_id = contexts[0].worker_id
        self.model = contexts[0].model

    @property
    def task_ids(self) -> list[str]:
        return [c.task_id for c in self.contexts]

    def should_stop(self) -> bool:
        return all(c.lost for c in self.contexts)

    def should_yield(self) -> bool:
        return any(c.yield_requested for c in self.contexts) or self.should_stop()

    def yield_now(self) -> NoReturn:
        for c in self.contexts:
            c.yielding = True
        raise Yielded(",".join(self.task_ids))


# positional-only: a handler's parameters may have any names (``engine``, ``payloads``...),
# and a worker passes them by position
class Handler(Protocol):
    def __call__(self, model: Any, payload: Any, ctx: Context, /) -> Any: ...


class BatchHandler(Protocol):
    def __call__(self, model: Any, payloads: list[Any], ctx: BatchContext, /) -> list[Any]: ...


H = TypeVar("H", bound=Handler | BatchHandler)  # bound: the decorated function keeps its type


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
    fn: Callable[..., Any]  # a Handler, or a BatchHandler when batched
    model: str | None  # None: runs with whatever model the task names
    batch: int = 1  # tasks per handler call at most
    batch_wait_ms: float = 0.0  # how long a batch short of `batch` may wait for more
    is_async: bool = False  # a coroutine function: it runs on the worker's event loop
    timeout_s: float | None = None  # a run of its handler call is stopped past this; None: no bound
    batched: bool = False  # registered with a batch size (1 too): called with a list of payloads


def is_coroutine_fn(fn: object) -> bool:
    """``async def`` (a partial of one, or an object whose ``__call__`` is one)."""
    call = type(fn).__call__ if callable(fn) else None  # a class instance's own method
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def check_batch(handler: str, batch: object, wait_ms: object) -> None:
    """A batch handler's settings, checked where it is registered (AppError: one line)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise AppError(f"handler {handler!r}: batch must be an integer from 1 to {MAX_BATCH}, "
                       f"got {batch!r}")
    if (isinstance(wait_ms, bool) or not isinstance(wait_ms, int | float)
            or not 0 <= wait_ms < math.inf):
        raise AppError(f"handler {handler!r}: batch_wait_ms must be a number of ms >= 0, "
                       f"got {wait_ms!r}")


def check_timeout(handler: str, timeout_s: object) -> None:
    """A handler's run bound, checked where it is registered (AppError: one line)."""
    if timeout_s is None:
        return
    if (isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float)
            or not 0 < timeout_s < math.inf):
        raise AppError(f"handler {handler!r}: timeout_s must be a number of seconds > 0 (or None), "
                       f"got {timeout_s!r}")


def check_name(what: str, name: object) -> None:
    """A name as a task must spell it (AppError): one no enqueue can give reaches no task."""
    if not isinstance(name, str) or not name.strip():
        raise AppError(f"{what} name must be a non-empty string, got {name!r}")
    if problem := name_problem(name):
        raise AppError(f"{what} name {problem}")


def check_callable(what: str, fn: object, takes: str = "") -> None:
    """A function, and (``takes``: its arguments, as a caller passes them) callable so."""
    if not callable(fn):
        raise AppError(f"{what} must be a function, got {fn!r}")
    if not takes:
        return
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (some builtins): called as it is
        return
    try:
        signature.bind(*takes.split(", "))
    except TypeError:  # every call would fail, each a task's attempt: refuse it at start
        # its parameters' kinds and defaults (a keyword-only ctx), not their types
        params = [p.replace(annotation=p.empty) for p in signature.parameters.values()]
        bare = signature.replace(parameters=params, return_annotation=signature.empty)
        raise AppError(f"{what} must take ({takes}) by position, got "
                       f"{getattr(fn, '__name__', 'a callable')}{bare}") from None


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
        """Register a model's loader: load(name) -> the model; ``vram_gb``: the weights'
        footprint (None: the VRAM each task declares); ``unload(model)`` when evicted."""
        check_name("model", name)
        if vram_gb is not None:  # as a task's: a number > 0, at most MAX_VRAM_GB
            try:
                positive_number("vram_gb", vram_gb, most=MAX_VRAM_GB)
            except InvalidTask as exc:
                raise AppError(f"model {name!r}: {exc.reason} (or None)") from None
        if unload is not None:
            check_callable(f"model {name!r}: unload", unload, "model")

        def register(load: Loader) -> Loader:
            check_callable(f"model {name!r}: the loader", load, "name")
            if name in self.models:
                raise AppError(f"model {name!r} is registered twice in app {self.name!r}")
            self.models[name] = ModelSpec(name, vram_gb, load, unload)
            return load
        return register

    def any_model(self, *, unload: Unloader | None = None) -> Callable[[Loader], Loader]:
        """Register a loader for any model name (its footprint is the task's VRAM)."""
        if unload is not None:
            check_callable("any_model: unload", unload, "model")

        def register(load: Loader) -> Loader:
            check_callable("any_model: the loader", load, "name")
            self.fallback = ModelSpec("*", None, load, unload)
            return load
        return register

    def handler(self, name: str, *, model: str | None = None, batch: int | None = None,
                batch_wait_ms: float = 0, timeout_s: float | None = None) -> Callable[[H], H]:
        """Register a handler: fn(model, payload, ctx) -> result; with a ``batch`` size (1
        too: a size read from settings keeps one calling convention), fn(model, payloads,
        ctx) -> one result per payload, in order (a BatchContext), its batch waiting up to
        ``batch_wait_ms`` for more tasks (never past a task's start-by time). Either may
        be ``async def`` (run on the worker's event loop). ``timeout_s``:
        a handler call (a batch's one call) still running this long fails its tasks
        (retryable) and is stopped as a lost run is (gpuq.worker.control); None: no bound."""
        check_name("handler", name)
        if model is not None:
            check_name(f"handler {name!r}: model", model)
        check_batch(name, 1 if batch is None else batch, batch_wait_ms)
        check_timeout(name, timeout_s)

        def register(fn: H) -> H:
            args = "model, payload, ctx" if batch is None else "model, payloads, ctx"
            check_callable(f"handler {name!r}", fn, args)
            if name in self.handlers:
                raise AppError(f"handler {name!r} is registered twice in app {self.name!r}")
            self.handlers[name] = HandlerSpec(name, fn, model, batch or 1, float(batch_wait_ms),
                                              is_coroutine_fn(fn),
                                              None if timeout_s is None else float(timeout_s),
                                              batched=batch is not None)
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
    """Import ``module:attr`` and return the App it names. The current directory is searched too,
    after the installed packages: ``gpuq worker --app myapp:app`` finds myapp.py there, as ``python
    -m`` would (the ``gpuq`` script's own path is its bin directory)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise AppError(f"--app must look like module:attr, got {path!r}")
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.append(here)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppError(f"cannot import app module {module_name!r}: {exc}") from None
    except Exception as exc:  # the module's own code failed: one line, with where it raised
        where = traceback.extract_tb(exc.__traceback__)[-1]
        raise AppError(f"cannot import app module {module_name!r}: {type(exc).__name__}: {exc} "
                       f"({where.filename}:{where.lineno})") from None
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise AppError(f"{path} is not a gpuq.App" if hasattr(module, attr)
                       else f"app module {module_name!r} has no {attr!r}")
    for spec in app.handlers.values():  # its tasks would all fail: the worker would publish it
        if spec.model is not None and app.model_spec(spec.model) is None:
            raise AppError(f"handler {spec.name!r} runs model {spec.model!r}, which has no loader "
                           f"in app {app.name!r} (@app.model({spec.model!r}) or @app.any_model())")
    return app
