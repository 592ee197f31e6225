"""The worker process's instructions per task, counted under cachegrind.

A burst worker of ``bench_batch``'s no-op app (``bench_batch:app``) drains N1, then (a fresh
process) N2 pre-enqueued tasks, each run under ``valgrind --tool=cachegrind --cache-sim=no``;
instructions per task = (I(N2) - I(N1)) / (N2 - N1), so the start-up and the exit (imports,
registering, the burst's last empty claim, leaving) cancel out. Counted for the single-task
handler and for the batch handler of 32. The Redis server runs natively: only the worker is
counted. Counts, unlike CPU µs, do not move with the host's load; hash randomisation and the
heartbeat (which beats by the clock) are the noise left: PYTHONHASHSEED is fixed, and the
beat's period set long enough that a drain sees only the first beat, which cancels out.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bench import ROOT, SCRIPTS_DIR
from gpuq.client import Queue
from gpuq.embedded import EmbeddedServer

MODEL, VRAM_GB, BATCH = "bench-model", 1.0, 32
HANDLERS = {"single": "bench.noop", "batch": "bench.batch_noop"}  # bench_batch's app
QUIET = {"GPUQ_HEARTBEAT_S": "3600", "GPUQ_LEASE_S": "7200", "GPUQ_SIM_TIME_SCALE": "0",
         "PYTHONHASHSEED": "0"}


def summary(path: Path) -> int:
    """The instructions a cachegrind output file counted (its ``summary:`` line)."""
    for line in reversed(path.read_text(errors="replace").splitlines()):
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"{path}: no summary line")


def counted_drain(url: str, kind: str, n: int, out: Path) -> int:
    """The instructions of one burst worker process draining n queued tasks of ``kind``."""
    pool = f"wi-{kind}-{n}"
    q = Queue.from_url(url, pool=pool)
    ids = [t.id for s in range(0, n, 2000) for t in q.enqueue_many(
        [{"handler": HANDLERS[kind], "payload": {"i": i}, "model": MODEL, "vram_gb": VRAM_GB}
         for i in range(s, min(n, s + 2000))])]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    env.update(QUIET, PYTHONPATH=os.pathsep.join([str(ROOT), str(SCRIPTS_DIR)]), VALGRIND_OPTS="")
    args = ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
            sys.executable, "-m", "gpuq", "--redis", url, "--pool", pool, "worker", "--app",
            "bench_batch:app", "--vram-gb", "80", "--gpu-name", "bench", "--name", pool, "--burst"]
    done = subprocess.run(args, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} worker exited with {done.returncode}:\n{done.stderr[-3000:]}")
    pipe = q.redis.pipeline(transaction=False)
    for tid in ids:
        pipe.hget(q.keys.task(tid), "state")
    states = Counter(pipe.execute())
    q.close()
    if states != Counter({"succeeded": n}):
        raise RuntimeError(f"{kind} drain of {n}: task states {dict(states)}")
    return summary(out)


def measure(n1: int, n2: int, port: int = 0) -> dict[str, Any]:
    """Instructions per task of the single-task and the batch=32 handler's drains."""
    result: dict[str, Any] = {"n1": n1, "n2": n2}
    server = EmbeddedServer()
    server.port = port  # 0: a free one
    with server, tempfile.TemporaryDirectory(prefix="gpuq-cachegrind-") as tmp:
        for kind in HANDLERS:
            i1 = counted_drain(server.url, kind, n1, Path(tmp) / f"{kind}-a.out")
            i2 = counted_drain(server.url, kind, n2, Path(tmp) / f"{kind}-b.out")
            result[f"worker_{kind}_instructions"] = round((i2 - i1) / (n2 - n1))
    return result
