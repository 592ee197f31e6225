"""Client-issued vs Lua-internal commands, told apart by MONITOR."""

from __future__ import annotations

import re
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from bench.stats import Window, window


class CommandMonitor:
    """Counts the commands Redis runs, split by source: a client connection or a Lua script.

    Redis counts commands a script runs in INFO commandstats under their own names, exactly
    like the same commands sent by clients; MONITOR tags each command with its source
    ("[0 lua]" for script-internal ones), so it can tell them apart. MONITOR slows the
    server, so this runs in its own pass, never while a throughput figure is timed.
    Phases are delimited by ECHO markers sent through the server itself.
    """

    LINE = re.compile(rb'^\+[0-9.]+ \[\d+ ([^\]]+)\] "([^"]*)"(?: "([^"]*)")?')

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(b"MONITOR\r\n")
        self.current: str | None = None
        self.counts: dict[str, Counter[tuple[str, str]]] = {}
        self.ended: dict[str, threading.Event] = {}
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            buf += data
            lines = buf.split(b"\r\n")
            buf = lines.pop()
            for line in lines:
                self._line(line)

    def _line(self, line: bytes) -> None:
        m = self.LINE.match(line)
        if not m:
            return
        source, command, first = m.groups()
        if command.upper() == b"ECHO" and first and first.startswith(b"gpuqbench:"):
            _, kind, name = first.decode().split(":", 2)
            if kind == "start":
                self.current = name
                self.counts[name] = Counter()
            else:
                self.current = None
                self.ended[name].set()
            return
        if self.current is not None:
            kind = "lua" if source == b"lua" else "client"
            self.counts[self.current][(kind, command.decode().lower())] += 1

    @contextmanager
    def phase(self, name: str, r: redis.Redis, windows: list[Window]) -> Iterator[None]:
        self.ended[name] = threading.Event()
        with window(r, windows):
            r.echo(f"gpuqbench:start:{name}")
            yield
            r.echo(f"gpuqbench:end:{name}")
        if not self.ended[name].wait(120):
            raise RuntimeError(f"MONITOR never saw the end of phase {name}")
        windows[-1].commands["echo"] = windows[-1].commands.get("echo", 0) - 2
        windows[-1].commands = {k: v for k, v in windows[-1].commands.items() if v}

    def split(self, name: str) -> tuple[int, int, dict[str, int]]:
        """(client commands, Lua-internal commands, client commands by name) of a phase."""
        c = self.counts[name]
        client = sum(v for (k, _), v in c.items() if k == "client")
        lua = sum(v for (k, _), v in c.items() if k == "lua")
        by_name = {cmd: v for (k, cmd), v in sorted(c.items()) if k == "client"}
        return client, lua, by_name

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
