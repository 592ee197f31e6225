"""A client of the Redis Cluster master that owns one pool's hash slot.

Every key of a pool shares the hash tag ``{pool}`` (gpuq.keys), so all of a pool's commands
and scripts go to one master. ``cluster_client`` returns a plain ``redis.Redis`` whose
connections look that master up each time they connect (``CLUSTER SLOTS`` from any node
they know), as redis-py's Sentinel pool asks the Sentinels. A reply that says the slot is
served elsewhere now (``MOVED``: a replica took over or the slot was moved; ``CLUSTERDOWN``,
``READONLY``, ``TRYAGAIN``, ``ASK``, a blocked pop ``UNBLOCKED`` by a role change) drops the
connection and raises ``SlotMoved``, a ConnectionError: nothing was run, so the client's
retry policy (by default, a few retries on SlotMoved only) sends the command again to the
owner. Every hot path (gpuq.wire.exchange on the client's pool, pipelines) works unchanged.
A lost connection (the master died) is a ConnectionError as on a single server: the next
connect finds the master the cluster promoted, once it has.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.crc import key_slot
from redis.retry import Retry

from gpuq.keys import Keys

QUERY_TIMEOUT_S = 2.0  # a node asked for the slot map: a dead one must not hang the connect
REDIRECTS = (redis.exceptions.AskError, redis.exceptions.ClusterDownError,
             redis.exceptions.TryAgainError, redis.exceptions.ReadOnlyError)
# a node's refusal of the login or of CLUSTER SLOTS: every node of a cluster shares it
REFUSALS = (redis.AuthenticationError, redis.exceptions.AuthenticationWrongNumberOfArgsError,
            redis.exceptions.NoPermissionError, redis.exceptions.AuthorizationError)
# the options of a connection that the slot-map queries share (login, TLS)
_SHARED = ("username", "password", "credential_provider", "ssl_keyfile", "ssl_certfile",
           "ssl_cert_reqs", "ssl_ca_certs", "ssl_check_hostname", "ssl_ca_data", "ssl_ca_path")


class SlotMoved(redis.ConnectionError):
    """The pool's slot is served by another node now; nothing was run."""


def pool_slot(pool: str) -> int:
    """The hash slot of every key of ``pool``."""
    return int(key_slot(Keys(pool).base.encode()))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SlotMap:
    """Finds the master of one slot by asking the nodes it knows (the seeds, then every
    node a slot map named), the one that answered last first."""

    def __init__(self, nodes: Sequence[tuple[str, int]], slot: int, ssl: bool,
                 options: dict[str, Any]) -> None:
        if not nodes:
            raise ValueError("a cluster needs at least one host:port")
        self.nodes = list(dict.fromkeys((h, int(p)) for h, p in nodes))
        self.slot = slot
        self.hint: tuple[str, int] | None = None  # where a MOVED said the slot went
        self._ssl = ssl
        self._options = {k: v for k, v in options.items() if k in _SHARED}
        self._lock = threading.Lock()

    def owner(self) -> tuple[str, int]:
        """The master of the slot (a MOVED's address if one came since the last lookup)."""
        with self._lock:
            if self.hint is not None:
                found, self.hint = self.hint, None
                return found
            failures: list[str] = []
            last: BaseException | None = None
            for node in list(self.nodes):
                try:
                    found = self._ask(node)
                except REFUSALS:
                    raise  # wrong credentials or ACL: a message of its own, not "cannot reach"
                except (redis.RedisError, OSError, ValueError) as exc:
                    failures.append(f"{node[0]}:{node[1]}: {exc}")
                    last = exc
                    continue
                self.nodes.remove(node)
                self.nodes.insert(0, node)
                return found
            # chained, so that a TLS failure under it is reported as one
            raise redis.ConnectionError(f"no cluster node named the master of slot {self.slot}: "
                                        + "; ".join(failures)) from last

    def _ask(self, node: tuple[str, int]) -> tuple[str, int]:
        kind = redis.SSLConnection if self._ssl else redis.Connection
        conn: Any = kind(host=node[0], port=node[1], socket_timeout=QUERY_TIMEOUT_S,
                    socket_connect_timeout=QUERY_TIMEOUT_S, **self._options)
        try:
            conn.send_command("CLUSTER", "SLOTS")
            ranges = conn.read_response()
        finally:
            conn.disconnect()
        found = None
        for start, end, master, *replicas in ranges:
            for entry in (master, *replicas):  # learn every node, for when the seeds are gone
                address = (_text(entry[0]) or node[0], int(entry[1]))
                if address not in self.nodes:
                    self.nodes.append(address)
            if int(start) <= self.slot <= int(end):
                found = (_text(master[0]) or node[0], int(master[1]))
        if found is None:
            raise ValueError(f"slot {self.slot} is not served (the cluster is not set up)")
        return found


class SlotOwnerConnection(redis.Connection):
    """A connection to whichever master owns the pool's slot when it connects."""

    def __init__(self, *, slot_map: SlotMap, **kwargs: Any) -> None:
        self.slot_map = slot_map
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]

    def _connect(self) -> Any:
        self.host, self.port = self.slot_map.owner()
        return super()._connect()  # type: ignore[no-untyped-call]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)
        except redis.ResponseError as exc:
            unblocked = str(exc).startswith("UNBLOCKED")  # a pop ended by a role change
            if not (isinstance(exc, REDIRECTS) or unblocked):
                raise
            if isinstance(exc, redis.exceptions.AskError):
                if int(exc.slot_id) != self.slot_map.slot:
                    raise  # a key outside the pool's slot: the caller's mistake, not a move
                if isinstance(exc, redis.exceptions.MovedError):
                    self.slot_map.hint = (exc.host, int(exc.port))
            self.disconnect()  # type: ignore[no-untyped-call]
            raise SlotMoved(moved_why(exc, self.slot_map.slot, f"{self.host}:{self.port}")) from exc


def moved_why(exc: redis.ResponseError, slot: int, node: str) -> str:
    """What a redirect or refusal of the pool's slot means for its user (the error a call
    raises once its retries are spent)."""
    if isinstance(exc, redis.exceptions.MovedError):
        return f"slot {slot} moved from {node} to {exc.host}:{exc.port} (MOVED)"
    if isinstance(exc, redis.exceptions.AskError):  # redis-py's MovedError is one too
        return (f"slot {slot} is migrating from {node} to {exc.host}:{exc.port} (ASK): the pool's "
                "calls fail until the migration ends (its scripts need all of its keys on one node)")
    if isinstance(exc, redis.exceptions.ClusterDownError):
        return (f"the cluster is down at {node} (CLUSTERDOWN): a slot has no master; with "
                "cluster-require-full-coverage yes (the default) every shard refuses, no keeps "
                "the pools of the others serving")
    return f"slot {slot} at {node}: {exc}"


class SlotOwnerSSLConnection(SlotOwnerConnection, redis.SSLConnection):
    """The same over TLS (``rediss+cluster://``)."""


def cluster_client(nodes: Sequence[tuple[str, int]], pool: str, **options: Any) -> redis.Redis:
    """A client of the master serving ``pool``'s slot, found through ``nodes`` (any nodes of
    the cluster) and followed across failovers. ``options`` are redis-py connection options
    (``ssl=True`` for TLS); without ``retry``, a command that meets a redirection is sent
    again up to three times (backoff 50 ms doubling), other errors are not retried."""
    options = dict(options)
    ssl = bool(options.pop("ssl", False))
    options.pop("db", None)  # a cluster has only database 0
    options.setdefault("retry", Retry(ExponentialBackoff(cap=0.5, base=0.05), 3,
                                      supported_errors=(SlotMoved,)))
    slot_map = SlotMap(nodes, pool_slot(pool), ssl, options)
    kind = SlotOwnerSSLConnection if ssl else SlotOwnerConnection
    connections = redis.ConnectionPool(connection_class=kind, slot_map=slot_map, **options)
    return redis.Redis(connection_pool=connections)
