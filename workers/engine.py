"""A simulated continuous-batching inference engine, served by ``async def`` handlers.

An LLM server's engine runs its model one step at a time, one token for every request in
flight; a request that arrives while a step runs joins the next step. A step costs a fixed
time (the weights are read once per step) plus a small time per request in it, so N
concurrent requests finish far faster than N requests one at a time. Run it with
``--concurrency N``: the worker's N tasks are N coroutines on its event loop, sharing the one
engine its (async) loader built.

    python -m gpuq worker --app workers.engine:app --vram-gb 80 --gpu-name sim-80GB --concurrency 16
    python -m gpuq enqueue engine.generate --payload '{"tokens": 32}' --model sim-llm --vram-gb 18 --wait

The model ``sim-llm`` holds 16 GB of weights; a task declaring ``vram_gb`` 18 uses 2 GB of
working memory (its KV cache) above them, so 16 such tasks hold 16 + 16 x 2 GB of the ledger.
Handlers: ``engine.generate`` (async: ``tokens`` steps, giving way when asked to yield and
resuming from its checkpoint), ``engine.stubborn`` (async: ignores yield requests the first
time a task runs in this process, so the worker cancels it; logs the CancelledError it
sees), ``engine.flaky`` (async: raises on its first attempt) and ``engine.info`` (a blocking
handler on the same engine). Load and step times are multiplied by ``GPUQ_SIM_TIME_SCALE``
(default 1.0), as in workers/sim.py. Nothing here fakes a result: each reports what happened.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from typing import Any

from gpuq.app import App, Context

log = logging.getLogger(__name__)
MODEL, WEIGHTS_GB = "sim-llm", 16.0
LOAD_S = 1.0  # seconds to load the weights
STEP_S = 0.020  # a step's fixed cost: every weight is read once per step
PER_REQUEST_S = 0.001  # a step's cost per request in it
LOADS = 0  # loader calls in this process
STUBBORN_SEEN: set[str] = set()  # tasks engine.stubborn has run in this process

app = App("engine")


def scale() -> float:
    return float(os.environ.get("GPUQ_SIM_TIME_SCALE", "1.0"))


class Engine:
    """Steps the requests waiting for it: those that arrive while a step runs wait for the
    next one, which takes them all."""

    def __init__(self, name: str, step_s: float, per_request_s: float) -> None:
        self.name = name
        self.id = uuid.uuid4().hex[:8]
        self.step_s = step_s
        self.per_request_s = per_request_s
        self.steps = 0
        self.widest = 0  # most requests in one step so far
        self._waiting: list[asyncio.Future[int]] = []
        self._stepper: asyncio.Task[None] | None = None

    async def step(self) -> int:
        """Wait until a step has run for this request; returns how many requests it ran."""
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append(done)
        if self._stepper is None or self._stepper.done():
            self._stepper = asyncio.create_task(self._run())
        return await done

    async def _run(self) -> None:
        while self._waiting:
            batch, self._waiting = [f for f in self._waiting if not f.done()], []
            if not batch:  # every waiter was cancelled
                continue
            await asyncio.sleep(self.step_s + self.per_request_s * len(batch))
            self.steps += 1
            self.widest = max(self.widest, len(batch))
            for f in batch:
                if not f.done():  # a request cancelled mid-step gets nothing
                    f.set_result(len(batch))
            # let the requests just stepped ask for their next token before the next step
            # starts, so those in flight stay in one batch (as in an engine's running set)
            await asyncio.sleep(0)

    async def close(self) -> None:
        if self._stepper is not None:
            self._stepper.cancel()


@app.model(MODEL, vram_gb=WEIGHTS_GB, unload=Engine.close)
async def load(name: str) -> Engine:
    global LOADS
    LOADS += 1
    await asyncio.sleep(LOAD_S * scale())
    log.info("engine.loaded model=%s loads=%d", name, LOADS)
    return Engine(name, STEP_S * scale(), PER_REQUEST_S * scale())


def report(engine: Engine, ctx: Context, **extra: Any) -> dict[str, Any]:
    return {"worker": ctx.worker_id, "attempt": ctx.attempt, "engine": engine.id,
            "engine_steps": engine.steps, "loads": LOADS, "pid": os.getpid(), **extra}


@app.handler("engine.generate", model=MODEL)
async def generate(engine: Engine, payload: Any, ctx: Context) -> dict[str, Any]:
    """``tokens`` engine steps (default 16), resuming from a checkpoint; on a yield request
    it saves the tokens done and gives way. Payload flag ``log``: say when it starts."""
    tokens = int((payload or {}).get("tokens", 16))
    if (payload or {}).get("log"):
        log.info("engine.generating task=%s from=%s", ctx.task_id, ctx.checkpoint or 0)
    resumed = done = int(ctx.checkpoint or 0)
    widest = 0
    while done < tokens:
        if ctx.should_yield():
            ctx.yield_now(done)
        widest = max(widest, await engine.step())
        done += 1
    return report(engine, ctx, tokens=done, resumed_from=resumed, widest_step=widest)


@app.handler("engine.stubborn", model=MODEL)
async def stubborn(engine: Engine, payload: Any, ctx: Context) -> dict[str, Any]:
    """Sleeps ``seconds`` (default 30) ignoring yield requests, the first time this process
    runs the task; at once after that. Logs the cancellation it sees."""
    first = ctx.task_id not in STUBBORN_SEEN
    STUBBORN_SEEN.add(ctx.task_id)
    log.info("engine.stubborn task=%s first=%s", ctx.task_id, first)
    try:
        await asyncio.sleep(float((payload or {}).get("seconds", 30)) if first else 0)
    except asyncio.CancelledError:
        log.info("engine.cancelled task=%s", ctx.task_id)
        raise
    return report(engine, ctx, first=first)


@app.handler("engine.flaky", model=MODEL)
async def flaky(engine: Engine, payload: Any, ctx: Context) -> dict[str, Any]:
    """Fails its first attempt (after one engine step), succeeds after."""
    await engine.step()
    if ctx.attempt == 1:
        raise RuntimeError("simulated engine failure")
    return report(engine, ctx)


@app.handler("engine.info", model=MODEL)
def info(engine: Engine, payload: Any, ctx: Context) -> dict[str, Any]:
    """A blocking handler on the same engine: runs in its runner thread."""
    return report(engine, ctx, steps=engine.steps, thread=threading.current_thread().name)
