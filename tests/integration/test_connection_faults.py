"""Servers that are there but cannot serve gpuq, against real redis-server processes this
module starts (a unix socket, a read-only replica, one out of memory): each fault is one
"Error: ..." line from the CLI and a GpuqError from the Python API, never a traceback; and
bounding the handshake leaves blocking pops without a read timeout.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

import gpuq.cli.base
import gpuq.client
from gpuq.aio import AsyncQueue
from gpuq.cli import cli
from gpuq.client import Queue
from gpuq.connection import CONNECT_OPTIONS, connect, connect_async, redis_errors
from gpuq.embedded import EmbeddedServer, free_port, stop_process
from gpuq.errors import ConfigError, ConnectionFailed, ServerRefused
from gpuq.views.exporter import read_figures

REDIS_SERVER = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="needs redis-server on PATH")
TASK = ["enqueue", "sim.run", "--model", "m", "--vram-gb", "1"]


def run_cli(url: str | None, *args: str, env: dict[str, str | None] | None = None) -> Result:
    given = ["--redis", url] if url is not None else []
    return CliRunner().invoke(cli, [*given, "--pool", f"p{uuid.uuid4().hex[:8]}", *args], env=env)


def clean_error(result: Result, *fragments: str, code: int = 5) -> str:
    """Exit ``code`` (5: Redis could not be used; 2: a configuration refused) with one
    "Error: ..." line and no traceback; returns that line."""
    assert result.exit_code == code and isinstance(result.exception, SystemExit), result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as running:
        yield running


@pytest.fixture(scope="module")
def unix_socket() -> Iterator[str]:
    """A redis-server listening on a unix socket only."""
    where = Path(tempfile.mkdtemp(prefix="gpuq-unix-"))  # short: socket paths are limited
    path = where / "r.sock"
    proc = subprocess.Popen([str(REDIS_SERVER), "--port", "0", "--unixsocket", str(path),
                             "--dir", str(where), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        client = redis.Redis(unix_socket_path=str(path), socket_timeout=1)
        stop_at = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except (redis.ConnectionError, FileNotFoundError):
                assert proc.poll() is None and time.monotonic() < stop_at, "redis-server did not start"
                time.sleep(0.02)
        client.close()
        yield f"unix://{path}"
    finally:
        stop_process(proc)
        shutil.rmtree(where, ignore_errors=True)


def test_unix_socket_urls_work(unix_socket: str) -> None:
    assert connect(unix_socket).ping()
    with Queue.from_url(unix_socket, pool="unix") as queue:
        task = queue.enqueue("sim.run", None, model="m", vram_gb=1)
        assert queue.record(task.id).state.value == "queued"

    async def through_asyncio() -> str:
        async with AsyncQueue.from_url(f"{unix_socket}?db=1", pool="unix") as queue:
            return (await queue.enqueue("sim.run", None, model="m", vram_gb=1)).id

    assert asyncio.run(through_asyncio())
    result = run_cli(unix_socket, "status", "--json")
    assert result.exit_code == 0, result.output
    clean_error(run_cli(f"{unix_socket}.missing", "status"), "cannot reach Redis at unix://",
                "r.sock.missing")


def test_database_out_of_range(server: EmbeddedServer) -> None:
    url = f"redis://127.0.0.1:{server.port}/99"
    clean_error(run_cli(url, "status"), "names a database the server does not have", code=2)
    with pytest.raises(ConfigError, match="DB index is out of range"):
        Queue.from_url(url).enqueue("sim.run", None, model="m", vram_gb=1)


def test_sentinel_url_at_a_plain_redis(server: EmbeddedServer) -> None:
    url = f"redis+sentinel://127.0.0.1:{server.port}/mymaster"
    clean_error(run_cli(url, "status"), "no master from the Sentinels", "not a Sentinel")


def test_read_only_replica(server: EmbeddedServer) -> None:
    with EmbeddedServer(extra=["--replicaof", "127.0.0.1", str(server.port)]) as replica:
        clean_error(run_cli(replica.url, *TASK), f"Redis at {replica.url} refused the command",
                    "read-only replica")
        with pytest.raises(ServerRefused, match="read-only replica"):
            Queue.from_url(replica.url).enqueue("sim.run", None, model="m", vram_gb=1)

        async def through_asyncio() -> None:
            async with AsyncQueue.from_url(replica.url) as queue:
                await queue.enqueue("sim.run", None, model="m", vram_gb=1)

        with pytest.raises(ServerRefused, match="read-only replica"):
            asyncio.run(through_asyncio())


def test_out_of_memory() -> None:
    with EmbeddedServer() as full:
        client = redis.Redis(port=full.port)
        client.set("ballast", b"x" * 4_000_000)
        client.config_set("maxmemory", "2mb")  # noeviction, the default: writes are refused
        clean_error(run_cli(full.url, *TASK), "refused the command", "out of memory")
        with pytest.raises(ServerRefused, match="out of memory"):
            Queue.from_url(full.url).enqueue("sim.run", None, model="m", vram_gb=1)
        client.close()


def test_a_full_server_still_shows_its_pool() -> None:
    """Regression: with the server at maxmemory (noeviction), status, top and the exporter's
    scrape failed, "out of memory": their queue depths were read in a MULTI, whose queued
    commands a full server refuses, reads included. A full pool is when its view matters."""
    with EmbeddedServer() as full:
        client = redis.Redis(port=full.port, decode_responses=True)
        pool = f"p{uuid.uuid4().hex[:8]}"
        queue = Queue.from_url(full.url, pool=pool)
        queue.enqueue("sim.run", None, model="m", vram_gb=1)
        client.set("ballast", b"x" * 4_000_000)
        client.config_set("maxmemory", "2mb")
        for args in (["status"], ["status", "--json"], ["top", "--once"]):
            result = CliRunner().invoke(cli, ["--redis", full.url, "--pool", pool, *args])
            assert result.exit_code == 0, result.output
            assert "out of memory" not in result.output
        figures = read_figures(client, queue.keys)
        assert [(p, m, n) for p, m, n, _ in figures.queues] == [("P2", "m", 1)]
        queue.close()
        client.close()


def test_silent_server_is_a_timeout_of_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port that accepts (the kernel completes the connection) and never answers: the
    CLI's first contact gives up after the connect timeout (shortened here), not never."""
    monkeypatch.setitem(CONNECT_OPTIONS, "socket_connect_timeout", 0.5)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        started = time.monotonic()
        clean_error(run_cli(f"redis://127.0.0.1:{silent.getsockname()[1]}/0", "status"),
                    "cannot reach Redis", "timed out: no reply within 0.5 s")
        assert time.monotonic() - started < 4


def test_blocking_pops_keep_no_read_timeout(server: EmbeddedServer) -> None:
    """The handshake's bound is the connect timeout; a pop that blocks longer afterwards is
    not cut short (workers and result waiters block on such pops)."""
    client = connect(server.url, socket_connect_timeout=0.2)
    started = time.monotonic()
    with redis_errors(server.url):
        assert client.blpop(["gpuq-test:nothing"], timeout=1) is None
    assert time.monotonic() - started >= 0.9
    client.close()

    async def through_asyncio() -> None:
        aclient = connect_async(server.url, socket_connect_timeout=0.2)
        try:
            assert await aclient.blpop(["gpuq-test:nothing"], timeout=1) is None
        finally:
            await aclient.aclose()

    started = time.monotonic()
    asyncio.run(through_asyncio())
    assert time.monotonic() - started >= 0.9


def test_an_asyncio_result_wait_on_a_frozen_server_ends_near_its_timeout(server: EmbeddedServer) -> None:
    """Found by an online service's owner: AsyncQueue.result(timeout=8) with the server
    frozen (SIGSTOP) for 25 s returned after 26 s, once the server came back: the asyncio
    client has no read timeout. Each try of a wait with a timeout is bounded by what is left
    of it (plus a second): it fails while the server is still frozen."""
    pauser = redis.Redis.from_url(server.url, socket_timeout=10)  # UNPAUSE waits out the pause

    async def wait() -> None:
        queue = AsyncQueue.from_url(server.url, pool="frozen-aio")
        task = await queue.enqueue("sim.run", model="m", vram_gb=1)
        pauser.execute_command("CLIENT", "PAUSE", 4000, "ALL")
        try:
            started = time.monotonic()
            with pytest.raises(ConnectionFailed, match="no reply within the wait's timeout"):
                await task.result(timeout=1.0)
            assert time.monotonic() - started < 3.5  # about 1 + 1 s, not the 4 s freeze
        finally:
            pauser.execute_command("CLIENT", "UNPAUSE")
            await queue.close()

    try:
        asyncio.run(wait())
    finally:
        pauser.close()


def test_a_frozen_server_fails_a_producer_s_and_a_view_s_call_in_bounded_time(
        server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by an operator's pass: with the server frozen (SIGSTOP, CLIENT PAUSE), a scrape
    of the exporter answered 200 after the whole freeze (25 s, past Prometheus' scrape
    timeout) with nothing logged, and `enqueue --wait --timeout 15` returned after 42 s: their
    clients had no read timeout. Producers (Queue.from_url), the views and the exporter now
    read with one (READ_TIMEOUT_S, 1 s here); blocking pops stay unbounded for the worker,
    the reaper and the bridge (above), and for AsyncQueue (a read timeout makes redis-py send
    under asyncio.wait_for, which drops a caller's cancellation: test_aio)."""
    for module in (gpuq.client, gpuq.cli.base):
        monkeypatch.setattr(module, "READ_TIMEOUT_S", 1.0)
    monkeypatch.setitem(CONNECT_OPTIONS, "socket_connect_timeout", 0.5)  # a new connection's handshake
    pauser = redis.Redis.from_url(server.url)
    queue = Queue.from_url(server.url, pool="frozen")
    queue.redis.ping()  # connected before the freeze: only a read is left to bound
    pauser.execute_command("CLIENT", "PAUSE", 4000, "ALL")
    try:
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):  # the exporter's scrape: a 503 and one log line
            read_figures(queue.redis, queue.keys, 50)
        with pytest.raises(ConnectionFailed, match="(?i)time"):  # on a new connection: its handshake
            queue.enqueue("sim.run", model="m", vram_gb=1)
        clean_error(run_cli(server.url, "status"), "cannot reach Redis")
        assert time.monotonic() - started < 3.5  # about 1 + 0.5 + 0.5 s, not the 4 s freeze
    finally:
        pauser.execute_command("CLIENT", "UNPAUSE")
        queue.close()
        pauser.close()


def test_empty_url_is_an_error_and_no_url_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    # the default points at a dead port here: whatever happens, the user's 6379 is not touched
    dead = f"redis://127.0.0.1:{free_port()}/0"
    monkeypatch.setattr(gpuq.cli.base, "DEFAULT_URL", dead)
    clean_error(run_cli("", "status"), "configuration: the Redis URL given", "is empty", code=2)
    clean_error(run_cli(None, "status", env={"GPUQ_REDIS_URL": ""}), "is empty", code=2)
    clean_error(run_cli(None, "status", env={"GPUQ_REDIS_URL": None}), f"cannot reach Redis at {dead}")
