"""Network namespaces for fault tests: workers behind a veth link the test can cut or slow.

``NetLab`` makes namespaces (each joined to the root namespace by a veth pair on its own /30
in 10.213.0.0/16, names unique per run), impairs their links with ``tc netem`` where the
kernel has it, or else with ``Relay``, a userspace TCP relay that delays and holds back
chunks the way a slow, lossy link looks to an application. Everything it made (processes in
its namespaces, namespaces, veths, relays) is removed on close, also when the test failed.

The module is also the worker app of those tests (``--app netns:app`` with tests/ on
PYTHONPATH): ``net.run`` appends one line per start and per end of a run to the file its
payload names, so a test counts handler runs rather than trusting the task's record.
"""

from __future__ import annotations

import ipaddress
import json
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from procs import ROOT, Proc, Procs

from gpuq.app import App, Context

NETWORK = ipaddress.IPv4Network("10.213.0.0/16")
APP = "netns:app"
APP_ENV = {"PYTHONPATH": str(ROOT / "tests")}

app = App("netfaults")


@app.any_model()
def load(name: str) -> str:
    return name


@app.handler("net.run")
def run(model: str, payload: Any, ctx: Context) -> dict[str, Any]:
    """Work for ``payload["seconds"][attempt - 1]`` (the last entry for later attempts),
    stopping early once the lease is lost; log the start and the end to ``payload["runs"]``."""
    durations = payload["seconds"]
    seconds = float(durations[min(ctx.attempt, len(durations)) - 1])
    note(payload["runs"], event="start", task=ctx.task_id, attempt=ctx.attempt, worker=ctx.worker_id)
    started = time.monotonic()
    while time.monotonic() - started < seconds and not ctx.should_stop():
        time.sleep(0.02)
    ran = round(time.monotonic() - started, 3)
    note(payload["runs"], event="end", task=ctx.task_id, attempt=ctx.attempt, worker=ctx.worker_id,
         ran_s=ran, stopped=ctx.should_stop())
    return {"worker": ctx.worker_id, "attempt": ctx.attempt, "ran_s": ran}


def note(path: str, **fields: Any) -> None:
    with open(path, "a") as fh:  # one short append per line: lines from two workers never mix
        fh.write(json.dumps({"t": round(time.time(), 3), **fields}) + "\n")


def runs(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


class Unavailable(Exception):
    """Namespaces or veths cannot be made here (the test skips with this reason)."""


def ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return out


@dataclass
class Namespace:
    name: str
    host_if: str  # the root namespace's end of the veth pair
    ns_if: str  # the end inside the namespace
    host_addr: str  # .1 of its /30, in the root namespace (Redis or a relay listens here)
    ns_addr: str  # .2, the namespace's own address

    def exec_args(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        """Partition: the namespace's end of the link goes down (its route with it)."""
        ip("link", "set", "dev", self.ns_if, "down", ns=self.name)

    def restore(self) -> None:
        ip("link", "set", "dev", self.ns_if, "up", ns=self.name)

    def netem(self, *options: str) -> str | None:
        """Impair both directions with ``tc qdisc ... netem OPTIONS``; None when it took, else
        why not (a kernel without sch_netem answers "Specified qdisc kind is unknown")."""
        for dev, ns in ((self.host_if, None), (self.ns_if, self.name)):
            cmd = [*(["ip", "netns", "exec", ns] if ns else []), "tc", "qdisc", "add", "dev", dev,
                   "root", "netem", *options]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
            if out.returncode != 0:
                return out.stderr.strip() or f"exit {out.returncode}"
        return None

    def python(self, code: str, timeout: float = 30) -> str:
        """Run a Python snippet inside the namespace; its stdout."""
        out = subprocess.run([*self.exec_args(), sys.executable, "-c", code], capture_output=True,
                             text=True, timeout=timeout, cwd=ROOT, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"in {self.name}: {out.stderr.strip()}")
        return out.stdout


class NetLab:
    """Namespaces, relays and in-namespace workers of one test; ``close`` removes them all."""

    def __init__(self) -> None:
        self.run_id = uuid.uuid4().hex[:6]
        self.namespaces: list[Namespace] = []
        self.relays: list[Relay] = []

    def __enter__(self) -> NetLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def check() -> None:
        if os.geteuid() != 0:
            raise Unavailable("network namespaces need root")
        if shutil.which("ip") is None:
            raise Unavailable("no `ip` command (iproute2)")

    def namespace(self) -> Namespace:
        self.check()
        n = len(self.namespaces)
        name = f"gq{self.run_id}{n}"
        net = self.free_subnet()
        hosts = list(net.hosts())
        space = Namespace(name, f"{name}h", f"{name}n", str(hosts[0]), str(hosts[1]))
        added = ip("netns", "add", name, check=False)
        if added.returncode != 0:
            raise Unavailable(f"`ip netns add` failed: {added.stderr.strip()}")
        self.namespaces.append(space)
        try:
            ip("link", "add", space.host_if, "type", "veth", "peer", "name", space.ns_if, "netns", name)
        except RuntimeError as exc:
            raise Unavailable(f"cannot make a veth pair: {exc}") from None
        ip("addr", "add", f"{space.host_addr}/30", "dev", space.host_if)
        ip("link", "set", "dev", space.host_if, "up")
        ip("addr", "add", f"{space.ns_addr}/30", "dev", space.ns_if, ns=name)
        ip("link", "set", "dev", space.ns_if, "up", ns=name)
        ip("link", "set", "dev", "lo", "up", ns=name)
        return space

    def free_subnet(self) -> ipaddress.IPv4Network:
        """A random /30 of NETWORK that no address of this host falls in."""
        taken = [ipaddress.ip_interface(word.split()[3]).ip
                 for word in ip("-o", "-4", "addr", "show").stdout.splitlines()]
        blocks = NETWORK.num_addresses // 4
        for _ in range(100):
            net = ipaddress.IPv4Network(f"{NETWORK.network_address + 4 * random.randrange(1, blocks)}/30")
            if not any(addr in net for addr in taken):
                return net
        raise Unavailable(f"no free /30 in {NETWORK}")

    def worker(self, procs: Procs, space: Namespace, url: str, name: str, *, concurrency: int = 1,
               env: dict[str, str] | None = None, timeout: float = 20.0) -> Proc:
        """A real worker process (the counting app) inside ``space``, talking to ``url``;
        waits until it registered. ``procs`` stops it at teardown."""
        args = [*space.exec_args(), sys.executable, "-m", "gpuq", "--redis", url, "--pool", procs.pool,
                "worker", "--app", APP, "--vram-gb", "80", "--gpu-name", "sim-80GB", "--name", name,
                "--concurrency", str(concurrency)]
        proc = Proc(name, args, procs.environment({**APP_ENV, **(env or {})}),
                    procs.tmp_path / f"{space.name}-{name}.log")
        procs.procs.append(proc)
        procs.wait_registered(proc, timeout)
        return proc

    def relay(self, listen: tuple[str, int], target: tuple[str, int], **options: Any) -> Relay:
        relay = Relay(listen, target, **options)
        self.relays.append(relay)
        relay.start()
        return relay

    def close(self) -> None:
        for relay in self.relays:
            relay.stop()
        for space in reversed(self.namespaces):
            # only this lab's processes live in its namespaces (tests stop theirs first)
            for pid in ip("netns", "pids", space.name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            ip("netns", "del", space.name, check=False)  # takes its veth pair with it
            if ip("link", "show", "dev", space.host_if, check=False).returncode == 0:
                ip("link", "del", "dev", space.host_if, check=False)
        self.namespaces.clear()
        self.relays.clear()


class Relay:
    """A TCP relay that behaves as a slow, lossy link: every chunk is forwarded ``delay_s``
    after it arrived, in each direction, and a ``loss`` share of chunks is held back a further
    ``rto_s`` (what an application sees of a lost segment: its retransmission timeout).
    Order is kept, so chunks behind a held one wait for it, as they do in TCP."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int], *, delay_s: float = 0.3,
                 loss: float = 0.05, rto_s: tuple[float, float] = (0.2, 0.4), seed: int = 1) -> None:
        self.listen_addr, self.target = listen, target
        self.delay_s, self.loss, self.rto_s = delay_s, loss, rto_s
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.chunks = 0
        self.held = 0  # chunks held back as lost
        self.stopped = threading.Event()
        self.sockets: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.listener = socket.create_server(listen)
        self.listener.settimeout(0.2)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def start(self) -> None:
        self.spawn(self.accept)

    def spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self.lock:
            self.threads.append(thread)
        thread.start()

    def accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            with self.lock:
                self.sockets += [client, upstream]
            if self.stopped.is_set():  # stop() ran meanwhile and did not see these two
                client.close()
                upstream.close()
                return
            for src, dst in ((client, upstream), (upstream, client)):
                chunks: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
                self.spawn(self.read, src, chunks)
                self.spawn(self.write, dst, chunks)

    def due(self, last: float) -> float:
        with self.lock:
            self.chunks += 1
            lost = self.rng.random() < self.loss
            extra = self.rng.uniform(*self.rto_s) if lost else 0.0
            self.held += lost
        return max(last, time.monotonic() + self.delay_s + extra)

    def read(self, src: socket.socket, chunks: queue.Queue[tuple[float, bytes] | None]) -> None:
        last = 0.0
        try:
            while data := src.recv(65536):
                last = self.due(last)
                chunks.put((last, data))
        except OSError:
            pass
        chunks.put(None)

    def write(self, dst: socket.socket, chunks: queue.Queue[tuple[float, bytes] | None]) -> None:
        try:
            while (item := chunks.get()) is not None:
                due, data = item
                if self.stopped.wait(max(0.0, due - time.monotonic())):
                    return
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def stop(self) -> None:
        self.stopped.set()
        self.listener.close()
        with self.lock:
            sockets, threads = list(self.sockets), list(self.threads)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for thread in threads:
            thread.join(5)
