"""The soak's processes: one Redis server with an append-only file, workers and reapers.

The server restarts on the same port and directory, so its append-only file is what it comes
back with. Every process logs to a file in the run directory and is killed, if still alive,
when the cluster closes (also on Ctrl-C or a failure of the soak itself).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import redis

from gpuq.embedded import EmbeddedServer

from .aof import AofWatch
from .settings import Settings, WorkerSpec

ROOT = Path(__file__).resolve().parents[2]
APP = "workers.chaos:app"


class Server:
    """redis-server with ``appendonly yes`` and the given ``appendfsync``; no rewrites of
    the file, so the one it appends to stays the same for the crash emulation."""

    def __init__(self, run_dir: Path, fsync: str) -> None:
        self.data = run_dir / "redis"
        self.data.mkdir()
        self.embedded = EmbeddedServer(appendonly=True, extra=[
            "--appendfsync", fsync, "--auto-aof-rewrite-percentage", "0"])
        self.embedded.dir = str(self.data)
        self.watch: AofWatch | None = None

    @property
    def url(self) -> str:
        return self.embedded.url

    def start(self) -> None:
        self.embedded.start(timeout=60)
        self.watch = self.watch or AofWatch(self.data)

    def stop(self, how: str, lose_s: float = 1.0) -> int:
        """"term": a clean shutdown (the server writes out its file); "kill": kill -9;
        "crash": kill -9 with the host's unsynced writes lost (chaos.aof). Returns the bytes
        of the file the crash cut."""
        proc = self.embedded.proc
        assert proc is not None
        if how == "term":
            proc.terminate()
        else:
            proc.send_signal(signal.SIGSTOP)  # frozen: nothing more reaches the file
            proc.kill()
        proc.wait(30)
        self.embedded.proc = None
        return self.watch.cut_back(lose_s) if how == "crash" and self.watch else 0

    def close(self) -> None:
        if self.watch:
            self.watch.close()
        self.embedded.stop(keep_dir=True)  # the run directory is removed with the rest


@dataclass
class Proc:
    name: str
    kind: str  # "worker" | "reaper"
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    spec: WorkerSpec | None = None
    stopped: bool = False  # SIGSTOPped now
    killed: bool = False  # by the injector (set before the signal: not revived)
    revived: bool = False  # exited by itself and replaced (Cluster.revive)
    started: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.popen.pid, sig)


class Cluster:
    def __init__(self, run_dir: Path, settings: Settings, pool: str) -> None:
        self.run_dir = run_dir
        self.settings = settings
        self.pool = pool
        self.server = Server(run_dir, settings.fsync)
        self.procs: list[Proc] = []
        self._names: dict[str, int] = {}
        self._naming = threading.Lock()  # the injector and the reviver start processes
        self.fates = threading.Lock()  # a worker is either killed or revived, never both
        (run_dir / "runs").mkdir()
        (run_dir / "logs").mkdir()

    # processes
    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
        env.update(self.settings.env)
        env["GPUQ_CHAOS_RUN_DIR"] = str(self.run_dir / "runs")
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _spawn(self, name: str, kind: str, args: list[str], spec: WorkerSpec | None = None) -> Proc:
        log_path = self.run_dir / "logs" / f"{name}.log"
        log_file = open(log_path, "wb")
        cmd = [sys.executable, "-m", "gpuq", "--redis", self.server.url, "--pool", self.pool, *args]
        # its own session: a Ctrl-C at the terminal reaches the soak only, which stops them all
        popen = subprocess.Popen(cmd, env=self.environment(), cwd=ROOT, stdin=subprocess.DEVNULL,
                                 stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        proc = Proc(name, kind, popen, log_path, log_file, spec)
        self.procs.append(proc)
        return proc

    def _name(self, base: str) -> str:
        with self._naming:
            n = self._names.get(base, 0)
            self._names[base] = n + 1
        return base if n == 0 else f"{base}-r{n}"

    def worker(self, slot: int, spec: WorkerSpec) -> Proc:
        name = self._name(f"w{slot}")
        return self._spawn(name, "worker", [
            "worker", "--app", APP, "--vram-gb", f"{spec.vram_gb:g}", "--gpu-name", spec.gpu,
            "--concurrency", str(spec.concurrency), "--name", name], spec)

    def replace_worker(self, proc: Proc) -> Proc:
        """A new worker in the slot of ``proc`` (w3-r2 is slot 3), with its spec."""
        assert proc.spec is not None
        return self.worker(int(proc.name[1:].split("-")[0]), proc.spec)

    def revive(self) -> list[tuple[Proc, Proc]]:
        """Replace each worker that exited by itself (not killed by the injector): one whose
        handler would not stop exits EXIT_STUCK for its supervisor to restart it, and the
        soak is that supervisor. Returns (the one exited, its replacement) pairs."""
        with self.fates:
            gone = [p for p in self.procs
                    if p.kind == "worker" and not (p.killed or p.revived) and not p.alive()]
            for proc in gone:
                proc.revived = True
        return [(proc, self.replace_worker(proc)) for proc in gone]

    def mark_killed(self, proc: Proc) -> bool:
        """Claim ``proc`` for a kill by the injector; False when it already exited by itself
        and was revived."""
        with self.fates:
            proc.killed = not proc.revived
            return proc.killed

    def reaper(self, slot: int) -> Proc:
        return self._spawn(self._name(f"reaper{slot}"), "reaper", ["reaper"])

    def live(self, kind: str) -> list[Proc]:
        return [p for p in self.procs if p.kind == kind and p.alive()]

    def active_reaper(self, client: redis.Redis, lock_key: str) -> Proc | None:
        """The live reaper that holds the pool's lock: its token is in the lock and in the
        reaper's own log line ``reaper.active ... token=<first 8>``."""
        token = client.get(lock_key)
        if not token:
            return None
        mark = f"reaper.active pool={self.pool} token={str(token)[:8]}"
        for proc in self.live("reaper"):
            if mark in proc.log_path.read_text(errors="replace"):
                return proc
        return None

    def stop_all(self, timeout: float = 30.0) -> None:
        """SIGTERM every live process (continuing stopped ones) and wait for them."""
        for proc in self.procs:
            if proc.alive():
                proc.signal(signal.SIGCONT)
                proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.signal(signal.SIGKILL)

    def close(self) -> None:
        """Kill whatever is left, then the server: always safe to call."""
        for proc in self.procs:
            if proc.alive():
                proc.signal(signal.SIGCONT)
                proc.signal(signal.SIGKILL)
            try:
                proc.popen.wait(10)
            except subprocess.TimeoutExpired:
                pass
            proc.log_file.close()
        self.server.close()
