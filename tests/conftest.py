"""Shared fixtures: a real Redis server the suite starts itself, and the contract backends.

The server is started once per session on a free port in a temporary directory (never the
user's 127.0.0.1:6379). ``GPUQ_TEST_CLUSTER=1`` starts it as a one-node Redis Cluster owning
every slot, where a script touching a key outside its pool's hash slot fails; CI runs the
suite that way once, with a hash-tagged prefix from ``GPUQ_TEST_PREFIX``.

A one-node cluster alone does not make it fail: Redis 7 and Valkey let a script without a
``#!lua`` line (gpuq's scripts keep Redis 6.2 support) touch undeclared keys of any slot the
node serves. So in cluster mode the suite's real clients register every script with a
``#!lua`` line, which makes the server reject keys outside the slot of ``KEYS[1]``; the
server fixture checks that the rejection works before any test runs.

``GPUQ_TEST_CLUSTER3=1`` starts a Redis Cluster of three masters with a replica each
(tests/cluster3.py): ``redis_server`` is then its first master, and each test's pool is put
on the masters in turn (on that first one when the test uses ``redis_server`` itself), its
real client pinned to the pool's master by ``gpuq.cluster.cluster_client``.

``backend`` runs a test twice: on fakeredis (its own FakeServer per test, Lua enabled) and on
the real server; ``queue`` is the contract suite's entry, one fresh pool per test. ``procs``
runs real gpuq processes (workers, reapers, the CLI) against ``redis_server``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
from procs import Procs

from gpuq import Config, Queue
from gpuq.embedded import EmbeddedServer

PREFIX = os.environ.get("GPUQ_TEST_PREFIX", "gpuq")
CLUSTER = os.environ.get("GPUQ_TEST_CLUSTER", "") == "1"
CLUSTER3 = os.environ.get("GPUQ_TEST_CLUSTER3", "") == "1"
USER_REDIS_PORT = 6379

Connect = Callable[..., redis.Redis]
MakeQueue = Callable[..., Queue]


class SlotCheckedRedis(redis.Redis):
    """A client whose registered scripts carry a ``#!lua`` line: on a cluster node the
    server then rejects any key outside the slot of the script's declared keys."""

    def register_script(self, script: Any) -> Any:
        text = script.decode() if isinstance(script, bytes) else script
        return super().register_script("#!lua\n" + text)


def _check_slot_enforcement(url: str, key: str = "gpuq:{p}:a", other: str = "x") -> None:
    """A script touching ``other`` (another slot, on the same node) besides its declared
    ``key`` fails."""
    client = SlotCheckedRedis.from_url(url)
    stray = client.register_script("redis.call('GET', KEYS[1]); return redis.call('GET', ARGV[1])")
    try:
        with pytest.raises(redis.ResponseError, match="same slot"):
            stray(keys=[key], args=[other])
    finally:
        client.close()


@pytest.fixture(scope="session")
def cluster3() -> Iterator[Any]:
    """The three-master cluster of GPUQ_TEST_CLUSTER3 (None otherwise)."""
    if not CLUSTER3:
        yield None
        return
    from cluster3 import Cluster3

    with Cluster3() as cluster:
        first = cluster.masters()[0]
        _check_slot_enforcement(cluster.node(first).url, f"gpuq:{{{cluster.pool_on(first, 'p')}}}:a",
                                f"gpuq:{{{cluster.pool_on(first, 'q')}}}:x")
        yield cluster


@pytest.fixture(scope="session")
def redis_server(cluster3: Any) -> Iterator[EmbeddedServer]:
    if cluster3 is not None:
        yield cluster3.node(cluster3.masters()[0])
        return
    server = EmbeddedServer("redis", cluster=CLUSTER)
    server.start()
    try:
        assert server.port != USER_REDIS_PORT, "the suite must never touch the user's Redis"
        if CLUSTER:
            _check_slot_enforcement(server.url)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def prefix() -> str:
    return PREFIX


@pytest.fixture(scope="session")
def connect(request: pytest.FixtureRequest) -> Iterator[Connect]:
    """Factory of decode_responses clients: "fake" (a fresh FakeServer each) or "real"."""
    opened: list[redis.Redis] = []

    def make(kind: str, pool: str | None = None) -> redis.Redis:
        """``pool``: on the three-master cluster, a client of that pool's master."""
        client: redis.Redis
        cluster = request.getfixturevalue("cluster3")
        if kind == "fake":
            client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
        elif kind == "real" and cluster is not None and pool is not None:
            client = SlotCheckedRedis(connection_pool=cluster.client(pool).connection_pool)
        elif kind == "real":
            server: EmbeddedServer = request.getfixturevalue("redis_server")
            kind_of_client = SlotCheckedRedis if CLUSTER or CLUSTER3 else redis.Redis
            client = kind_of_client.from_url(server.url, decode_responses=True)
        else:  # pragma: no cover
            raise ValueError(kind)
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.close()
        # a cluster node's client runs on a pool it does not own, which close() leaves open:
        # its sockets would be closed by the collector, a ResourceWarning at a random time
        client.connection_pool.disconnect()


_placed = [0]  # pools placed on the three-master cluster so far


@pytest.fixture
def pool(request: pytest.FixtureRequest, cluster3: Any) -> str:
    name = f"t{uuid.uuid4().hex[:10]}"
    if cluster3 is None:
        return name
    masters = cluster3.masters()
    on = masters[0] if "redis_server" in request.fixturenames else masters[_placed[0] % len(masters)]
    _placed[0] += 1
    return str(cluster3.pool_on(on, stem=f"{name}-"))


@pytest.fixture(params=["fake", "real"])
def backend(request: pytest.FixtureRequest, connect: Connect, pool: str) -> redis.Redis:
    return connect(request.param, pool)


def _queue_factory(client: redis.Redis, pool: str, prefix: str) -> MakeQueue:
    def make(**config: Any) -> Queue:
        return Queue(client, Config(pool=pool, prefix=prefix, **config).validate())
    return make


@pytest.fixture
def make_queue(backend: redis.Redis, pool: str, prefix: str) -> MakeQueue:
    """Queue on the contract backend with config overrides, e.g. make_queue(fair_every=2)."""
    return _queue_factory(backend, pool, prefix)


@pytest.fixture
def queue(make_queue: MakeQueue) -> Queue:
    return make_queue()


@pytest.fixture
def procs(redis_server: EmbeddedServer, pool: str, prefix: str, tmp_path: Path) -> Iterator[Procs]:
    """Real gpuq processes (workers, reapers, the CLI) on the suite's server and this pool,
    stopped at the end (tests/procs.py)."""
    with Procs(redis_server.url, pool, prefix, tmp_path) as p:
        yield p


@pytest.fixture
def make_real_queue(connect: Connect, pool: str, prefix: str) -> MakeQueue:
    return _queue_factory(connect("real", pool), pool, prefix)


@pytest.fixture
def real_queue(make_real_queue: MakeQueue) -> Queue:
    return make_real_queue()
