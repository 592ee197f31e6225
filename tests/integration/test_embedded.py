"""gpuq.embedded: the throwaway server the demo, tests and benchmarks start."""

from __future__ import annotations

import socket

import pytest
import redis

from gpuq import embedded
from gpuq.embedded import EmbeddedServer


def _free_port_in(low: int, high: int) -> int:
    for port in range(low, high):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}..{high}")


def test_server_starts_on_a_free_port_and_stops() -> None:
    with EmbeddedServer() as server:
        assert server.port != 6379
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        client.close()
    assert server.proc is None and server.dir == ""


# Regression: with cluster=True the bus port defaulted to port + 10000, so a free port above
# 55535 (or one whose + 10000 was taken) made the server exit at once; it now gets its own
# free bus port.
def test_cluster_server_starts_whatever_free_port_the_os_offers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    high = _free_port_in(60000, 65000)  # a port the OS may hand out as ephemeral
    ports = iter([high])
    real_free_port = embedded.free_port
    monkeypatch.setattr(embedded, "free_port", lambda: next(ports, None) or real_free_port())
    server = EmbeddedServer(cluster=True)
    try:
        server.start(timeout=5)
        client = redis.Redis.from_url(server.url)
        assert "cluster_state:ok" in client.execute_command("CLUSTER", "INFO").decode()
        client.close()
    finally:
        server.stop()
