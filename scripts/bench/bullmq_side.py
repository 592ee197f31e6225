"""BullMQ's side: its Node client's enqueue one by one and in bulk and one worker's drain, on
the benchmark's server under a key prefix of its own (commands per job: bench.commands).

BullMQ (a pinned 5.x) is installed once with npm into ``.cache/bullmq/`` (git ignores
``.cache/``) and reused; without node or npm, or when the install fails, ``setup`` says why
and its figures are skipped. The Node scripts are in ``scripts/bench/bullmq/``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from bench import ROOT, SCRIPTS_DIR
from bench.common import Bench, log
from bench.procs import children_cpu, finish, spawn
from bench.stats import Drain, Window, make_drain, ms_to_s, read_times, window

VERSION = "5.81.5"
HOME = ROOT / ".cache" / "bullmq"
NODE_DIR = SCRIPTS_DIR / "bench" / "bullmq"
PREFIX = "bench-bullmq"  # BullMQ's keys: PREFIX:QUEUE:...; gpuq's and the others' never start so


def installed_version() -> str | None:
    try:
        meta = json.loads((HOME / "node_modules" / "bullmq" / "package.json").read_text())
    except (OSError, ValueError):
        return None
    return str(meta.get("version"))


def install(npm: str) -> str | None:
    """``npm install bullmq@VERSION`` into HOME; None when done, else why not."""
    log(f"bullmq: npm install bullmq@{VERSION} into {HOME} (once)")
    HOME.mkdir(parents=True, exist_ok=True)
    try:
        p = subprocess.run([npm, "install", "--prefix", str(HOME), "--save-exact", "--no-audit",
                            "--no-fund", "--loglevel=error", f"bullmq@{VERSION}"],
                           capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"npm install failed: {e}"
    if p.returncode != 0 or installed_version() != VERSION:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return f"npm install failed: {last}"
    return None


@dataclass(frozen=True)
class BullMQ:
    """A usable BullMQ: the node binary and the installed version."""

    node: str
    version: str
    node_version: str

    def args(self, script: str, b: Bench, queue: str, **extra: Any) -> list[str]:
        out = [self.node, str(NODE_DIR / script), "--home", str(HOME), "--url", b.url,
               "--prefix", PREFIX, "--queue", queue]
        for k, v in extra.items():
            out += [f"--{k}", str(v)]
        return out

    def produce(self, b: Bench, queue: str, mode: str, n: int, batch: int, warmup: int) -> dict[str, Any]:
        """Run producer.mjs to the end; its JSON line."""
        cmd = self.args("producer.mjs", b, queue, mode=mode, n=n, batch=batch, warmup=warmup)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=str(ROOT))
        if p.returncode != 0:
            raise RuntimeError(f"bullmq producer exited with {p.returncode}:\n{p.stderr[-3000:]}")
        return dict(json.loads(p.stdout.strip().splitlines()[-1]))

    def worker(self, b: Bench, queue: str, n: int, what: str) -> float:
        """Run worker.mjs until it has completed n jobs; its wall seconds."""
        return finish(spawn(self.args("worker.mjs", b, queue, n=n), b.log_dir, "bullmq-worker"),
                      1800, what)


def setup() -> tuple[BullMQ | None, str | None]:
    """(BullMQ, None) when node and bullmq@VERSION are there (installing it if need be),
    else (None, why it is skipped)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        return None, "node not found"
    if installed_version() != VERSION:
        if npm is None:
            return None, "npm not found"
        why = install(npm)
        if why:
            return None, why
    try:
        node_version = subprocess.run([node, "--version"], capture_output=True, text=True,
                                      timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"node does not run: {e}"
    return BullMQ(node, VERSION, node_version), None


def enqueue_one(bq: BullMQ, b: Bench, n: int) -> tuple[float, float]:
    """(jobs/s, client CPU µs per job) of ``await queue.add`` in a loop, timed in Node."""
    out = bq.produce(b, b.name("bull"), "one", n, b.sizes.batch, b.sizes.warmup)
    return float(out["per_s"]), float(out["cpu_us_per_task"])


def enqueue_bulk(bq: BullMQ, b: Bench, n: int) -> tuple[float, float]:
    """(jobs/s, client CPU µs per job) of ``queue.addBulk`` in calls of ``batch``."""
    out = bq.produce(b, b.name("bullbulk"), "bulk", n, b.sizes.batch, b.sizes.warmup)
    return float(out["per_s"]), float(out["cpu_us_per_task"])


def completed_keys(b: Bench, queue: str, n: int) -> list[str]:
    """The job hashes of a drained queue; raises unless all n jobs completed."""
    base = f"{PREFIX}:{queue}"
    ids = [str(i) for i in b.r.zrange(f"{base}:completed", 0, -1)]
    left = {k: int(b.r.llen(f"{base}:{k}")) for k in ("wait", "active")}
    failed = int(b.r.zcard(f"{base}:failed"))
    if len(ids) != n or failed or any(left.values()):
        raise RuntimeError(f"bullmq drain: {len(ids)} completed, {failed} failed, {left} left; "
                           f"expected {n} completed")
    return [f"{base}:{i}" for i in ids]


def drain(bq: BullMQ, b: Bench, n: int, windows: list[Window] | None = None) -> Drain:
    """One worker process (concurrency 1) drains n pre-enqueued no-op jobs; timed from the
    job hashes (``processedOn`` to ``finishedOn``, ms), like gpuq's from its task records."""
    queue = b.name("bulldrain")
    bq.produce(b, queue, "bulk", n, 5000, 0)
    own: list[Window] = []
    cpu0 = children_cpu()
    with window(b.r, own):
        wall = bq.worker(b, queue, n, "bullmq worker")
    cpu = children_cpu() - cpu0
    if windows is not None:
        windows.extend(own)
    starts, ends = read_times(b.r, completed_keys(b, queue, n), "processedOn", "finishedOn", ms_to_s)
    return make_drain(n, starts, ends, wall, cpu, own[0])
