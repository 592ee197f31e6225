"""Shared fixtures: a real Redis server the suite starts itself, and the contract backends.

The server is started once per session on a free port in a temporary directory (never the
user's 127.0.0.1:6379). ``GPUQ_TEST_CLUSTER=1`` starts it as a one-node Redis Cluster owning
every slot, so a script touching a key outside its pool's hash slot fails; CI runs the suite
that way once, with a hash-tagged prefix from ``GPUQ_TEST_PREFIX``.

``backend`` runs a test twice: on fakeredis (its own FakeServer per test, Lua enabled) and on
the real server; ``queue`` is the contract suite's entry, one fresh pool per test.
"""

from __future__ import annotations

import os
import random
import socket
import uuid
from typing import Any, Callable, Iterator

import fakeredis
import pytest
import redis

from gpuq import Config, Queue
from gpuq.embedded import EmbeddedServer

PREFIX = os.environ.get("GPUQ_TEST_PREFIX", "gpuq")
CLUSTER = os.environ.get("GPUQ_TEST_CLUSTER", "") == "1"
USER_REDIS_PORT = 6379

Connect = Callable[[str], redis.Redis]
MakeQueue = Callable[..., Queue]


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cluster_port() -> int:
    """A port whose cluster bus port (port + 10000) is free and valid.

    EmbeddedServer picks any free port, but Redis Cluster refuses ports above 55535 (its bus
    listens 10000 higher), so for cluster mode the suite picks the port itself.
    """
    for _ in range(200):
        port = random.randint(20000, 55000)
        if port != USER_REDIS_PORT and _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer("redis", cluster=CLUSTER)
    if CLUSTER:
        server.port = _cluster_port()
    server.start()
    assert server.port != USER_REDIS_PORT, "the suite must never touch the user's Redis"
    try:
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

    def make(kind: str) -> redis.Redis:
        client: redis.Redis
        if kind == "fake":
            client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
        elif kind == "real":
            server: EmbeddedServer = request.getfixturevalue("redis_server")
            client = redis.Redis.from_url(server.url, decode_responses=True)
        else:  # pragma: no cover
            raise ValueError(kind)
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.close()


@pytest.fixture
def pool() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["fake", "real"])
def backend(request: pytest.FixtureRequest, connect: Connect) -> redis.Redis:
    return connect(request.param)


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
def make_real_queue(connect: Connect, pool: str, prefix: str) -> MakeQueue:
    return _queue_factory(connect("real"), pool, prefix)


@pytest.fixture
def real_queue(make_real_queue: MakeQueue) -> Queue:
    return make_real_queue()
