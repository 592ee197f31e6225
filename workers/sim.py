"""A simulated GPU app: real worker processes, simulated model loads and GPU work.

Serves any model name a task gives: its VRAM footprint is the task's ``vram_gb`` and its
load time comes from the table below (default about a second). The handler ``sim.run``
sleeps for the payload's ``run_s``, else the task's ``est_s`` (the GPU work), gives way
when asked to yield (resuming from its checkpoint) and returns which worker and model ran
it. Both load and run times are multiplied by ``GPUQ_SIM_TIME_SCALE`` (default 1.0), so
demos and tests can run a realistic workload in seconds. ``GPUQ_SIM_LOAD_FAILS`` names
models (comma-separated) whose load raises on this worker, as when their weights are
missing from its host's disk. ``sim.noop`` returns at once (benchmarks); ``sim.fail``
raises (retry tests); ``sim.stream`` emits chunks over its run (streamed results).
Nothing here fakes a result: it reports what happened.
"""

from __future__ import annotations

import os
import time
from typing import Any

from gpuq.app import App, Context

# load seconds measured for models of these sizes (weights from local NVMe, fp16)
LOAD_S = {"llama3-8b": 12.0, "llama3-70b": 55.0, "mistral-7b": 10.0, "sdxl": 8.0,
          "whisper-large": 4.0, "bge-m3": 2.0}
# 16-bit 70B weights on a two-GPU group: each GPU reads its 70 GB shard, in parallel
LOAD_S["llama3-70b-fp16"] = 60.0
DEFAULT_LOAD_S = 1.0

app = App("sim")


def scale() -> float:
    return float(os.environ.get("GPUQ_SIM_TIME_SCALE", "1.0"))


class SimModel:
    def __init__(self, name: str) -> None:
        self.name = name
        self.loaded_at = time.time()


@app.any_model()
def load(name: str) -> SimModel:
    time.sleep(LOAD_S.get(name, DEFAULT_LOAD_S) * scale())
    if name in os.environ.get("GPUQ_SIM_LOAD_FAILS", "").split(","):
        raise FileNotFoundError(f"no weights for {name} on this host")
    return SimModel(name)


@app.handler("sim.run")
def run(model: SimModel, payload: Any, ctx: Context) -> dict[str, Any]:
    """Sleep for the payload's ``run_s`` (else the task's estimate) in short steps, giving
    way when asked: on a yield request it checkpoints the (simulated) seconds done and
    yields; the next run resumes from there. Payload flags for tests: "ignore_yield" keeps
    sleeping through yield and stop requests; "uninterruptible" sleeps in one native call
    nothing can interrupt."""
    flags = payload if isinstance(payload, dict) else {}
    seconds = float(flags.get("run_s", ctx.est_s)) * scale()
    done_before = float((ctx.checkpoint or {}).get("done_s", 0.0))
    started = time.monotonic()
    if flags.get("uninterruptible"):
        time.sleep(max(0.0, seconds - done_before))
    while not flags.get("uninterruptible"):
        done = done_before + time.monotonic() - started
        if done >= seconds or (ctx.should_stop() and not flags.get("ignore_yield")):
            break
        if ctx.should_yield() and not flags.get("ignore_yield"):
            ctx.yield_now({"done_s": round(done, 4)})
        time.sleep(min(seconds - done, 0.02))
    return {"worker": ctx.worker_id, "model": model.name, "attempt": ctx.attempt,
            "ran_s": round(time.monotonic() - started, 4), "resumed_from_s": done_before}


@app.handler("sim.stream")
def stream(model: SimModel, payload: Any, ctx: Context) -> int:
    """Emit ``payload["chunks"]`` chunks (default 10) evenly over the task's estimate, one
    at the end of each of as many equal steps, and return how many it emitted. A chunk is
    {"i", "attempt", "t": the worker's clock (epoch s) just before the emit}. Payload flags:
    "progress" reports progress with each chunk; "fail_first": n fails the first attempt
    after its n-th chunk (retry tests). It stops early when told to."""
    flags = payload if isinstance(payload, dict) else {}
    count = int(flags.get("chunks", 10))
    step = ctx.est_s * scale() / max(1, count)
    fail_first = flags.get("fail_first")
    emitted = 0
    for i in range(count):
        if ctx.should_stop():
            break
        time.sleep(step)
        ctx.emit({"i": i, "attempt": ctx.attempt, "t": time.time()})
        emitted += 1
        if flags.get("progress"):
            ctx.progress(emitted / count, f"chunk {emitted} of {count}")
        if fail_first is not None and ctx.attempt == 1 and emitted >= int(fail_first):
            raise RuntimeError(f"simulated failure after {emitted} chunks")
    return emitted


@app.handler("sim.noop")
def noop(model: SimModel, payload: Any, ctx: Context) -> Any:
    return payload


@app.handler("sim.fail")
def fail(model: SimModel, payload: Any, ctx: Context) -> Any:
    message = payload.get("message") if isinstance(payload, dict) else None
    raise RuntimeError(str(message or "simulated failure"))
