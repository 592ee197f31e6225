"""Server instructions per enqueue and per claim + ack, counted under callgrind.

Wall-clock µs of one script call move by 2x from hour to hour on shared VMs; the
instructions the server runs for it repeat within about 1%, so a change to a script is
judged by them (docs/BENCHMARKS.md, "Where gpuq's time goes"). The server runs under
``valgrind --tool=callgrind`` with instrumentation off; it is switched on
(``callgrind_control -i on``) only around the measured calls:

* enqueue: ``Queue.enqueue`` of one no-op task at a time into a pool without workers;
* claim + ack: one worker's loop over a deep queue of one model it holds, as
  ``gpuq.worker`` sends it (the previous task's ack and the next claim in one pipeline,
  which goes as one ``ack_claim`` call; a one-slot worker a claim gave a task tells the
  next claim it is not in ``idle``);
* batched task: the same loop for a batch handler of 32 (a claim takes the batch, the
  batch's acks ride with the next claim), counted per task.

* scale lifecycle: bench_scale's lifecycle phase at one point (W workers, M models, N queued;
  ``scripts/bench/scale*.py``) from one process: each turn, every claiming worker's ack with
  its next claim, then the replacement enqueues; per lifecycle (enqueue + claim + ack). Its
  pool has many models and idle online lanes, which bench_instructions' own loops do not.

Each phase is dumped on its own (``callgrind_control -d``); ``--top N`` prints the N
functions with the most instructions of each. Needs valgrind and redis-server on PATH. Run
it in two checkouts to compare them: the figures are of the checkout it runs from.

* worker (``--worker N1,N2``, instead of the phases above): the worker process's own
  instructions per task, single-task and batch=32 handlers, from burst drains of N1 and N2
  tasks under cachegrind (``scripts/bench/worker_instructions.py``).

    python scripts/bench_instructions.py [--steps 300] [--json] [--top 15] [--port P]
                                         [--scale W,M,N] (default 64,1000,10000; 0: skip)
    python scripts/bench_instructions.py --worker 200,1200 [--json] [--port P]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuq.claims import ClaimRequest  # noqa: E402
from gpuq.client import Queue  # noqa: E402
from gpuq.config import Config  # noqa: E402
from gpuq.embedded import free_port  # noqa: E402

WARMUP = 100
BATCH = 32  # tasks a batch handler's claim takes
SCALE_WARMUP, SCALE_TURNS = 3, 10  # turns of the scale phase (56 lifecycles a turn at W = 64)


def control(pid: int, *args: str) -> None:
    """callgrind_control on this run's server alone: without a target it would switch and
    dump every callgrind process of the user, another run's server among them."""
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def total(path: str) -> int:
    """The instructions a callgrind dump counted (its `totals:` line; `summary:` is 0 in a
    dump made while instrumentation is off)."""
    for line in reversed(Path(path).read_text(errors="replace").splitlines()):
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"{path}: no totals line")


def measure(url: str, steps: int, pid: int) -> None:
    """Run the three phases on the server under callgrind (its ``pid``), instrumented; each
    dumped when it ends."""
    client = redis.Redis.from_url(url, decode_responses=True)
    q = Queue(client, Config(pool="bench-claim"))
    q.enqueue_many([{"handler": "sim.noop", "payload": {"i": i}, "model": "m", "vram_gb": 1}
                    for i in range(steps + WARMUP + 10)])
    prev: dict[str, str] | None = None

    def step() -> None:
        nonlocal prev
        calls = [] if prev is None else [q.calls.ack(prev["id"], int(prev["token"]), '{"i":1}')]
        claim = q.calls.claim(ClaimRequest("w1", 78.0, 0.0, 1, [("m", 1.0)], unlisted=prev is not None))
        prev = claim.parse(q.scripts.pipelined([*calls, claim])[-1]).task
        if prev is None:
            raise RuntimeError("the queue ran dry")

    for _ in range(WARMUP):
        step()
    control(pid, "-i", "on")
    for _ in range(steps):
        step()
    control(pid, "-i", "off")
    control(pid, "-d", "claim_ack")
    e = Queue(client, Config(pool="bench-enqueue"))
    for i in range(WARMUP):
        e.enqueue("sim.noop", {"i": i}, model="m", vram_gb=1)
    control(pid, "-i", "on")
    for i in range(steps):
        e.enqueue("sim.noop", {"i": i}, model="m", vram_gb=1)
    control(pid, "-i", "off")
    control(pid, "-d", "enqueue")
    b = Queue(client, Config(pool="bench-batch"))
    n = (steps // BATCH + WARMUP // BATCH + 2) * BATCH
    for i in range(0, n, 1000):
        b.enqueue_many([{"handler": "h", "payload": {"i": j}, "model": "m", "vram_gb": 1}
                        for j in range(i, min(n, i + 1000))])
    batch: list[dict[str, str]] = []

    def batch_step() -> None:
        nonlocal batch
        calls = [b.calls.ack(t["id"], int(t["token"]), '{"i":1}') for t in batch]
        claim = b.calls.claim(ClaimRequest("w1", 78.0, 0.0, 1, [("m", 1.0)], batches=[("h", BATCH - 1)],
                                           unlisted=bool(batch)))
        got = claim.parse(b.scripts.pipelined([*calls, claim])[-1])
        if got.task is None:
            raise RuntimeError("the queue ran dry")
        batch = [got.task, *(got.batch.tasks if got.batch else [])]

    for _ in range(WARMUP // BATCH):
        batch_step()
    control(pid, "-i", "on")
    for _ in range(steps // BATCH):
        batch_step()
    control(pid, "-i", "off")
    control(pid, "-d", "batched")


def measure_scale(url: str, point: tuple[int, int, int], turns: int, pid: int) -> int:
    """bench_scale's lifecycles at ``point``, ``turns`` turns instrumented: how many."""
    from bench.scale import Point, Sizes
    from bench.scale_load import Workers

    p = Point(url, *point, Sizes(calls=1, load_s=0.0, procs=1, reaper_rounds=1, scrapes=1))
    p.register()
    p.fill()
    workers = Workers(p.scripts, p.calls, tuple(m.request for m in p.claimers))
    for _ in range(SCALE_WARMUP):
        workers.turn()
    done = 0
    control(pid, "-i", "on")
    for _ in range(turns):
        done += workers.turn()[0]
    control(pid, "-i", "off")
    control(pid, "-d", "scale")
    workers.stop()
    p.close()
    return done


def top(path: str, n: int) -> str:
    out = subprocess.run(["callgrind_annotate", path], capture_output=True, text=True).stdout
    lines = [ln for ln in out.splitlines() if ln.strip() and ln.lstrip()[0].isdigit()]
    return "\n".join(lines[:n + 1])


def worker_phase(ap: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    """The worker process's instructions per task (bench.worker_instructions)."""
    from bench.worker_instructions import BATCH as WORKER_BATCH
    from bench.worker_instructions import measure as measure_worker

    try:
        n1, n2 = (int(v) for v in a.worker.split(","))
    except ValueError:
        n1 = n2 = 0
    if not 0 < n1 < n2:
        ap.error(f"--worker: expected N1,N2 with 0 < N1 < N2, got {a.worker!r}")
    for tool in ("valgrind", "redis-server"):
        if not shutil.which(tool):
            print(f"bench_instructions: {tool} is not on PATH", file=sys.stderr)
            return 2
    result = measure_worker(n1, n2, a.port)
    if a.json:
        print(json.dumps(result))
    else:
        print(f"worker, single task  {result['worker_single_instructions']:>9,} instructions a task\n"
              f"worker, batched task {result['worker_batch_instructions']:>9,} instructions a task "
              f"(batches of {WORKER_BATCH}; drains of {n1} and {n2} tasks)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300, help="measured calls per phase (300)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--top", type=int, default=0, help="also print each phase's top functions")
    ap.add_argument("--port", type=int, default=0, help="redis-server port (default: a free one)")
    ap.add_argument("--scale", default="64,1000,10000",
                    help="W,M,N of the scale lifecycle phase (64,1000,10000; 0: skip it)")
    ap.add_argument("--worker", default="", metavar="N1,N2",
                    help="count the worker process's instructions per task instead (e.g. 200,1200)")
    a = ap.parse_args()
    if a.worker:
        return worker_phase(ap, a)
    try:
        point = None if a.scale == "0" else tuple(int(v) for v in a.scale.split(","))
    except ValueError:
        point = ()
    if point is not None and (len(point) != 3 or min(point) < 1):
        ap.error(f"--scale: expected W,M,N (positive integers) or 0, got {a.scale!r}")
    for tool in ("valgrind", "callgrind_control", "redis-server"):
        if not shutil.which(tool):
            print(f"bench_instructions: {tool} is not on PATH", file=sys.stderr)
            return 2
    port = a.port or free_port()
    with tempfile.TemporaryDirectory(prefix="gpuq-callgrind-") as tmp:
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={tmp}/callgrind.out", "redis-server", "--port", str(port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp,
            env=dict(os.environ, VALGRIND_OPTS=""))
        url = f"redis://127.0.0.1:{port}/0"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    redis.Redis.from_url(url).ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise RuntimeError("redis-server under valgrind did not start") from None
                    time.sleep(0.2)
            measure(url, a.steps, server.pid)
            lifecycles = measure_scale(url, point, SCALE_TURNS, server.pid) if point else 0
        finally:
            server.terminate()
            server.wait(60)
        dumps = sorted(glob.glob(f"{tmp}/callgrind.out.*"))
        if len(dumps) < (4 if point else 3):
            raise RuntimeError(f"expected a dump a phase, found {dumps}")
        claim_ack, enqueue, batched = dumps[0], dumps[1], dumps[2]
        result = {"steps": a.steps,
                  "enqueue_instructions": round(total(enqueue) / a.steps),
                  "claim_ack_instructions": round(total(claim_ack) / a.steps),
                  "batched_task_instructions": round(total(batched) / (a.steps // BATCH * BATCH)),
                  "server": subprocess.run(["redis-server", "--version"], capture_output=True,
                                           text=True).stdout.strip()}
        if point:
            result["scale_point"] = dict(zip(("workers", "models", "tasks"), point))
            result["scale_lifecycle_instructions"] = round(total(dumps[3]) / lifecycles)
        if a.json:
            print(json.dumps(result))
        else:
            print(f"{result['server']}\n"
                  f"enqueue       {result['enqueue_instructions']:>9,} instructions a call\n"
                  f"claim + ack   {result['claim_ack_instructions']:>9,} instructions a task\n"
                  f"batched task  {result['batched_task_instructions']:>9,} instructions a task "
                  f"(batches of {BATCH})")
            if point:
                print(f"scale cycle   {result['scale_lifecycle_instructions']:>9,} instructions a "
                      f"lifecycle (bench_scale W,M,N = {a.scale})")
        if a.top:
            for name, path in (("claim + ack", claim_ack), ("enqueue", enqueue), ("batched", batched)):
                print(f"\n{name}: top functions (all {a.steps} calls)\n{top(path, a.top)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
