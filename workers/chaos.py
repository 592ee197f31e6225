"""The chaos soak's app (scripts/chaos.py): simulated models and handlers that log every run.

Each handler run appends lines to a log of its own worker process, outside Redis, so the
soak's checker can count runs across Redis restarts and worker kills::

    start <task> <attempt> <worker> <run>
    <end> <task> <attempt> <worker> <run> <lost>

``end`` is ``ok`` (returned a result, which names the run), ``yield`` (gave way with a
checkpoint), ``fail`` (raised) or ``stop`` (interrupted by the worker); ``lost`` is 1 when the
worker had already been told the lease was lost. A run killed with its worker has a start line
only. The log lives in ``GPUQ_CHAOS_RUN_DIR`` (runs-<pid>.log); lines are single appends, so
threads and processes never interleave within a line.

Payload: ``{"kind": k, "s": seconds}`` with k one of ``run`` (works ``s`` seconds, yielding
with a checkpoint when asked), ``yield_once`` (yields itself halfway through its first run and
resumes from the checkpoint), ``fail_once`` (raises on its first attempt), ``fail_always``.
Handler ``chaos.timed`` has a ``timeout_s`` of ``TIMEOUT_S``: kind ``timeout_once`` works ``s``
seconds (past it) on its first attempt, heeding no stop (it is failed, then stopped past the
grace or its result discarded), and briefly after; ``timeout_always`` works ``s`` every time.

Stubborn kinds heed nothing the worker says (no ``should_stop``, no ``should_yield``), so a
run the worker wants ended is ended by force: ``stubborn`` (``chaos.run``) is a loop that never
checks, for ``s`` seconds every attempt: a cancel, a lost lease or a yield request past its
grace ends it with the worker's StopTask. On their first attempt ``stubborn_swallow``
(``chaos.timed``) and ``stubborn_async`` (``chaos.atimed``, ``async def``, the same
``timeout_s``) work ``s`` seconds, past the bound, and swallow the stop once: the first runs
each step under a broad ``except Exception``, which takes StopTask too; the second catches
the first cancel of its asyncio task. Still running ``stop_s`` after the stop, their worker
exits EXIT_STUCK (the soak restarts it); later attempts are brief. A run that swallowed a stop
and returned logs ``stop``, not ``ok``: its result must never be the task's.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from typing import Any

from gpuq.app import App, Context, Yielded

# name -> (VRAM footprint GB, load seconds)
MODELS = {"m-small": (4.0, 0.05), "m-mid": (10.0, 0.1), "m-large": (18.0, 0.2), "m-xl": (30.0, 0.3)}
TIMEOUT_S = 0.5  # chaos.timed's bound; its timeout kinds work at least twice as long

app = App("chaos")
_log_fd: int | None = None
_log_lock = threading.Lock()


def log_dir() -> str:
    return os.environ.get("GPUQ_CHAOS_RUN_DIR", "")


def note(*fields: object) -> None:
    """Append one line to this process's run log (opened on first use)."""
    global _log_fd
    directory = log_dir()
    if not directory:
        return
    with _log_lock:
        if _log_fd is None:
            path = os.path.join(directory, f"runs-{os.getpid()}.log")
            _log_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_log_fd, (" ".join(str(f) for f in fields) + "\n").encode())


class ChaosModel:
    def __init__(self, name: str) -> None:
        self.name = name


def _register(name: str, vram_gb: float, load_s: float) -> None:
    @app.model(name, vram_gb=vram_gb)
    def load(model_name: str) -> ChaosModel:
        time.sleep(load_s)
        return ChaosModel(model_name)


for _name, (_vram, _load) in MODELS.items():
    _register(_name, _vram, _load)


def work(ctx: Context, seconds: float, done_before: float, heed: bool = True) -> float:
    """Work until ``seconds`` are done in all (counting ``done_before``); give way with a
    checkpoint when asked to yield; stop early once the lease is lost. With ``heed`` False,
    neither (``should_yield()`` is true once the lease is lost, too): a handler that must be
    stopped. Returns seconds done."""
    started = time.monotonic()
    while True:
        done = done_before + time.monotonic() - started
        if done >= seconds or (heed and ctx.should_stop()):
            return done
        if heed and ctx.should_yield():
            ctx.yield_now({"done_s": round(done, 4)})
        time.sleep(min(seconds - done, 0.02))


@app.handler("chaos.timed", timeout_s=TIMEOUT_S)
def timed(model: ChaosModel, payload: Any, ctx: Context) -> dict[str, Any]:
    return run(model, payload, ctx)


def stubborn(seconds: float, swallow: bool) -> bool:
    """Work ``seconds`` looking at nothing the worker says; with ``swallow`` each step runs
    under a broad ``except Exception`` (a loop that logs an error and goes on), which takes
    the worker's StopTask too. Returns whether a stop was swallowed."""
    until, swallowed = time.monotonic() + seconds, False
    while (left := until - time.monotonic()) > 0:
        if not swallow:
            time.sleep(min(left, 0.02))
            continue
        try:
            time.sleep(min(left, 0.02))
        except Exception:  # StopTask among them: it derives from Exception
            swallowed = True
    return swallowed


def begin(ctx: Context) -> tuple[str, tuple[object, ...]]:
    """A new run's id and the fields its log lines start with; its start line written."""
    run_id = uuid.uuid4().hex[:12]
    head = (ctx.task_id, ctx.attempt, ctx.worker_id, run_id)
    note("start", *head)
    return run_id, head


def result(run_id: str, ctx: Context, model: ChaosModel, done_before: float = 0.0) -> dict[str, Any]:
    return {"run": run_id, "worker": ctx.worker_id, "attempt": ctx.attempt, "model": model.name,
            "resumed_from_s": done_before}


@app.handler("chaos.run")
def run(model: ChaosModel, payload: Any, ctx: Context) -> dict[str, Any]:
    kind = str(payload.get("kind", "run"))
    seconds = float(payload.get("s", 0.1))
    run_id, head = begin(ctx)
    end = "stop"
    try:
        done_before = float((ctx.checkpoint or {}).get("done_s", 0.0))
        if kind == "stubborn" or (kind == "stubborn_swallow" and ctx.attempt == 1):
            swallowed = stubborn(seconds, swallow=kind == "stubborn_swallow")
            end = "stop" if swallowed else "ok"
            return result(run_id, ctx, model)
        if kind == "yield_once" and ctx.checkpoint is None:
            work(ctx, seconds / 2, 0.0)
            ctx.yield_now({"done_s": round(seconds / 2, 4)})
        if kind == "fail_always" or (kind == "fail_once" and ctx.attempt == 1):
            work(ctx, seconds / 2, 0.0)
            raise RuntimeError(f"chaos: {kind} on attempt {ctx.attempt}")
        if kind == "timeout_always" or (kind == "timeout_once" and ctx.attempt == 1):
            work(ctx, seconds, 0.0, heed=False)
        else:
            work(ctx, 0.1 if kind in ("timeout_once", "stubborn_swallow") else seconds, done_before)
        end = "ok"
        return result(run_id, ctx, model, done_before)
    except Yielded:
        end = "yield"
        raise
    except RuntimeError:
        end = "fail"
        raise
    finally:  # StopTask (a stop past the yield deadline) leaves end at "stop"
        note(end, *head, int(ctx.lost))


@app.handler("chaos.atimed", timeout_s=TIMEOUT_S)
async def atimed(model: ChaosModel, payload: Any, ctx: Context) -> dict[str, Any]:
    """Kind ``stubborn_async``: awaits heeding nothing, ``s`` seconds on its first attempt,
    swallowing the first cancel of its asyncio task (a second one ends it)."""
    run_id, head = begin(ctx)
    end, swallowed = "stop", False
    try:
        until = time.monotonic() + (float(payload.get("s", 0.1)) if ctx.attempt == 1 else 0.1)
        while (left := until - time.monotonic()) > 0:
            try:
                await asyncio.sleep(min(left, 0.02))
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed = True
        end = "stop" if swallowed else "ok"
        return result(run_id, ctx, model)
    finally:  # cancelled twice, or the worker's exit: "stop" or no end line
        note(end, *head, int(ctx.lost))
