"""A server that may evict keys (maxmemory set, a policy other than noeviction) loses tasks:
the reaper says so at start, and ``gpuq status`` shows it, against a real server this
module starts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from procs import Procs, wait_for

from gpuq import eviction
from gpuq.embedded import EmbeddedServer

pytestmark = pytest.mark.slow
WARNING = "warning: Redis may evict keys (maxmemory-policy allkeys-lru, maxmemory 104857600 bytes)"


@pytest.fixture
def evicting() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(extra=["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]).start()
    yield server
    server.stop()


def test_a_server_that_may_evict_is_named_by_the_reaper_and_status(
        evicting: EmbeddedServer, prefix: str, tmp_path: Path) -> None:
    with Procs(evicting.url, "p", prefix, tmp_path) as procs:
        status = procs.cli("status")
        assert status.returncode == 0 and WARNING in status.stdout.splitlines()[1], status.stdout
        once = procs.cli("reaper", "--once")  # a cron-style reaper says it too
        assert once.returncode == 0 and "redis.may_evict" in once.stderr, once.stderr
        reaper = procs.reaper()
        wait_for(lambda: "redis.may_evict" in reaper.log(), 10, 0.05, "the reaper's warning")
        client = redis.Redis(port=evicting.port)
        client.config_set("maxmemory-policy", "noeviction")
        assert "warning" not in procs.cli("status").stdout
        client.config_set("maxmemory-policy", "volatile-lru")  # leases and locks carry TTLs
        client.config_set("maxmemory", "0")  # no limit: nothing is ever evicted
        assert eviction.risk(client) is None
        client.close()
