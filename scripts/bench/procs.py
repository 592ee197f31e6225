"""Worker processes: start one with its output in a log file, wait for it, stop it."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import ROOT, SCRIPTS_DIR
from bench.common import log

GPUQ_SIM_ENV = {"GPUQ_SIM_TIME_SCALE": "0"}  # the simulated model load is instant


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    log_path: Path
    started: float

    def tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""


def children_cpu() -> float:
    """CPU seconds (user + system) of every child process that has been waited for."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def spawn(args: list[str], log_dir: Path, tag: str, env: dict[str, str] | None = None) -> Proc:
    """Start a process in the repository root, with no GPUQ_* settings but ``env``'s, and the
    checkout and scripts/ on its import path (gpuq, workers.sim, bench.minimal, rq's job)."""
    log_path = log_dir / f"{tag}-{uuid.uuid4().hex[:6]}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(SCRIPTS_DIR)] + ([full_env["PYTHONPATH"]] if full_env.get("PYTHONPATH") else []))
    with open(log_path, "wb") as fh:
        started = time.perf_counter()
        proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, cwd=str(ROOT), env=full_env)
    return Proc(proc, log_path, started)


def finish(p: Proc, timeout: float, what: str) -> float:
    """Wait for a process; returns its wall seconds. Raises with its log on failure."""
    try:
        rc = p.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        p.proc.kill()
        p.proc.wait()
        raise RuntimeError(f"{what} did not finish in {timeout}s:\n{p.tail()}") from None
    wall = time.perf_counter() - p.started
    if rc != 0:
        raise RuntimeError(f"{what} exited with {rc}:\n{p.tail()}")
    return wall


def stop(p: Proc, what: str) -> None:
    if p.proc.poll() is None:
        p.proc.send_signal(signal.SIGTERM)
        try:
            p.proc.wait(40)
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait()
            log(f"{what} did not stop on SIGTERM; killed")


def wait_until(pred: Callable[[], bool], timeout: float, what: str, p: Proc | None = None) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if p is not None and p.proc.poll() is not None:
            raise RuntimeError(f"{what}: process exited with {p.proc.returncode}:\n{p.tail()}")
        if time.monotonic() > end:
            raise RuntimeError(f"{what}: not ready after {timeout}s" + (f":\n{p.tail()}" if p else ""))
        time.sleep(0.02)


def gpuq_worker_args(url: str, pool: str, *, burst: bool, name: str | None = None) -> list[str]:
    args = [sys.executable, "-m", "gpuq", "--redis", url, "--pool", pool, "worker",
            "--app", "workers.sim:app", "--vram-gb", "80", "--gpu-name", "bench"]
    if name:
        args += ["--name", name]
    if burst:
        args.append("--burst")
    return args


def minimal_worker_args(url: str, name: str, *, burst: bool) -> list[str]:
    args = [sys.executable, "-m", "bench.minimal", "--url", url, "--name", name]
    if burst:
        args.append("--burst")
    return args


def rq_worker_args(url: str, queue: str) -> list[str]:
    rq_bin = Path(sys.executable).parent / "rq"
    head = [str(rq_bin)] if rq_bin.exists() else [sys.executable, "-c",
                                                  "import sys; from rq.cli import main; sys.exit(main())"]
    return head + ["worker", "--burst", "-w", "rq.worker.SimpleWorker", "-q", "--url", url,
                   "--path", str(SCRIPTS_DIR), queue]
