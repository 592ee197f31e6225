"""A long-lived worker stays flat: N tasks through one worker process, its RSS sampled.

Starts its own server (EmbeddedServer, a free port, nothing persisted) and one real worker
process (``workers.sim:app``, instant model loads, ``sim.run`` tasks with a tiny estimate),
feeds it N tasks in bulk batches (``Queue.enqueue_many``) and reads the worker's VmRSS from
/proc at N/100, N/10, N/4, N/2 and N succeeded tasks (counted from the pool's stats hash).
Exits 1 if RSS at N exceeds 1.1 x RSS at N/10 (the warm-up before N/10 is not judged).

    python scripts/rss_soak.py                  # 100,000 tasks: RSS at 10k against 100k
    python scripts/rss_soak.py --tasks 20000    # 2k against 20k
    python scripts/rss_soak.py --json           # one JSON object on stdout

Finished tasks stay readable for ``--result-ttl`` seconds (default 300), so the server's
memory stays bounded on long runs; the worker's RSS is what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from gpuq import Config, Queue  # noqa: E402
from gpuq.embedded import EmbeddedServer  # noqa: E402
from gpuq.task import ended_count  # noqa: E402

POOL = "soak"
APP = "workers.sim:app"  # its sim.run handler and any-model loader
WORKER = "soak-worker"
MARKS = (0.01, 0.1, 0.25, 0.5, 1.0)  # of N: where RSS is read
BASE, LIMIT = 0.1, 1.1  # RSS(N) must stay within LIMIT x RSS(BASE x N)
MODELS = ("m0", "m1", "m2", "m3")  # all resident at once on the declared 80 GB GPU
STALL_S = 60.0  # no task succeeding for this long ends the run


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def start_worker(url: str, app: str, concurrency: int, ttl_s: float,
                 log_path: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    path = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update({"GPUQ_SIM_TIME_SCALE": "0", "GPUQ_RESULT_TTL_S": str(ttl_s), "PYTHONPATH": path})
    args = [sys.executable, "-m", "gpuq", "--redis", url, "--pool", POOL, "--log-level", "warning",
            "worker", "--app", app, "--vram-gb", "80", "--name", WORKER,
            "--concurrency", str(concurrency), "--idle-timeout", "0"]
    with open(log_path, "wb") as log:
        return subprocess.Popen(args, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)


def batch_of(start: int, end: int) -> list[dict[str, Any]]:
    return [{"handler": "sim.run", "payload": {"i": i}, "model": MODELS[i % len(MODELS)],
             "vram_gb": 10, "est_s": 0.001} for i in range(start, end)]


def feed_and_sample(queue: Queue, worker: subprocess.Popen[bytes], n: int, batch: int,
                    log_path: Path) -> list[dict[str, Any]]:
    """Keep at most two batches queued ahead of the worker; read its RSS at each mark."""
    client, stats = queue.redis, queue.keys.stats
    marks = sorted({max(1, round(n * m)) for m in MARKS})
    samples: list[dict[str, Any]] = []
    enqueued, done, began = 0, 0, time.monotonic()
    progress_at = began
    while marks:
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited with {worker.returncode}:\n{log_path.read_text()[-3000:]}")
        if enqueued < n and enqueued - done < batch:
            end = min(n, enqueued + batch)
            queue.enqueue_many(batch_of(enqueued, end))
            enqueued = end
        count = ended_count(client.hgetall(stats), "succeeded")
        if count >= marks[0]:
            rss = rss_kb(worker.pid)  # first: the count it goes with is the one just read
            samples.append({"tasks": count, "rss_mb": round(rss / 1024, 2),
                            "elapsed_s": round(time.monotonic() - began, 2)})
            while marks and count >= marks[0]:
                marks.pop(0)
        if count > done:
            done, progress_at = count, time.monotonic()
        elif time.monotonic() - progress_at > STALL_S:
            raise RuntimeError(f"no task succeeded for {STALL_S:g} s at {done}/{n}")
        time.sleep(0.005)
    return samples


def soak(n: int, concurrency: int, batch: int, ttl_s: float, app: str = APP) -> dict[str, Any]:
    with EmbeddedServer("redis") as server, tempfile.TemporaryDirectory(prefix="gpuq-soak-") as tmp:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        queue = Queue(client, Config(pool=POOL).validate())
        log_path = Path(tmp) / "worker.log"
        worker = start_worker(server.url, app, concurrency, ttl_s, log_path)
        try:
            deadline = time.monotonic() + 30
            while not client.hget(queue.keys.worker(WORKER), "state"):
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the worker did not start:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.05)
            samples = feed_and_sample(queue, worker, n, batch, log_path)
        finally:
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        server_mb = int(client.info("memory")["used_memory"]) / 2**20
        client.close()
    base = next(s for s in samples if s["tasks"] >= round(n * BASE))
    final = samples[-1]
    ratio = final["rss_mb"] / base["rss_mb"]
    return {"tasks": n, "app": app, "concurrency": concurrency, "batch": batch, "samples": samples,
            "base_tasks": base["tasks"], "ratio": round(ratio, 4), "limit": LIMIT, "ok": ratio <= LIMIT,
            "elapsed_s": final["elapsed_s"], "tasks_per_s": round(final["tasks"] / final["elapsed_s"]),
            "server_used_memory_mb": round(server_mb, 1)}


def render(report: dict[str, Any]) -> str:
    lines = [f"{'tasks':>9}  {'RSS MB':>8}  {'elapsed s':>9}"]
    lines += [f"{s['tasks']:>9,}  {s['rss_mb']:>8.2f}  {s['elapsed_s']:>9.2f}" for s in report["samples"]]
    verdict = "flat" if report["ok"] else "GROWING"
    lines.append(f"RSS at {report['samples'][-1]['tasks']:,} / RSS at {report['base_tasks']:,} = "
                 f"{report['ratio']:.3f} (limit {report['limit']}): {verdict}; "
                 f"{report['tasks_per_s']:,} tasks/s; "
                 f"server used_memory {report['server_used_memory_mb']} MB")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks through the worker (>= 100)")
    parser.add_argument("--concurrency", type=int, default=1, choices=(1, 2))
    parser.add_argument("--batch", type=int, default=5000, help="tasks per enqueue_many call")
    parser.add_argument("--result-ttl", type=float, default=300.0, help="seconds a finished task stays")
    parser.add_argument("--app", default=APP, help="module:attr of an App with a sim.run handler "
                        "(to check that the soak catches a leaking one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.tasks < 100 or args.batch < 1:
        parser.error("--tasks must be >= 100 and --batch >= 1")
    report = soak(args.tasks, args.concurrency, args.batch, args.result_ttl, args.app)
    print(json.dumps(report) if args.json else render(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
