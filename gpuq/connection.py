"""The one place a Redis URL (and TLS files) becomes a client, and Redis faults become errors.

URL forms (every command and ``Queue.from_url`` take them):

- ``redis://[user:password@]host:port/db``; ``unix:///path/redis.sock?db=0``
- ``rediss://...``: TLS, the server's certificate verified (against the ``ca`` file, else the
  system's CAs), with a client certificate when ``cert``/``key`` are given
- ``redis+sentinel://[user:password@]host:port[,host:port...]/master-name[/db]``: the master
  a Sentinel names, followed across failovers. ``user:password`` log in to the master; the
  Sentinels themselves are asked without a password unless the query gives one
  (``?sentinel_password=...&sentinel_username=...``). ``rediss+sentinel://``: TLS to both.
- ``redis+cluster://[user:password@]host:port[,host:port...]`` (``rediss+cluster://``): a
  Redis Cluster, through ``gpuq.cluster.cluster_client``.

Errors and log lines show URLs with the password masked (``gpuq.redact``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
import redis.asyncio as aredis
import redis.asyncio.sentinel
import redis.sentinel

from gpuq.aio_pool import CheckedSentinelPool, client_from_url
from gpuq.errors import (
    AuthenticationFailed,
    ConfigError,
    ConnectionFailed,
    NoMaster,
    PermissionDenied,
    TlsFailed,
)
from gpuq.redact import redact, redact_url
from gpuq.refusals import denied as denied
from gpuq.refusals import first_line, refusal, sentinel_refusal
from gpuq.tls import ClosedAfterHandshake, SentinelTlsConnection, Tls, TlsConnection, cause_of

# no read timeout by default (a caller's client may block on pops as long as it asks); keepalive
# and the connect timeout (which covers the handshake too: _start) catch a dead server
CONNECT_OPTIONS: dict[str, Any] = {"decode_responses": True, "socket_timeout": None,
                                   "socket_connect_timeout": 5, "socket_keepalive": True}
# clients whose calls block at most 5 s (a result wait's or a stream's pop: gpuq.producer's
# MAX_BLOCK_S): producers, the views, the exporter; the worker and the reaper get it past their
# longest pop (gpuq.cli.base.open_queue). A frozen server (SIGSTOP, CLIENT PAUSE) then fails a
# call in this long rather than hang it past a wait's timeout, a scrape's or for good.
# Not AsyncQueue's: with a read timeout redis-py sends under asyncio.wait_for, which drops a
# caller's cancellation landing as the send completes (Python 3.11)
READ_TIMEOUT_S = 7.0
TCP_ONLY = ("socket_keepalive",)  # redis-py's unix socket connections refuse it
try:  # redis-py >= 6.4: with maintenance notifications on (its default), the asyncio pool
    # skips its check for a socket the server closed, and the first call on each connection a
    # restart or a server timeout dropped fails (the sync pool checks: gpuq.wire)
    from redis.maint_notifications import MaintNotificationsConfig
    _NO_MAINT: dict[str, Any] = {"maint_notifications_config": MaintNotificationsConfig(enabled=False)}
except ImportError:  # older redis-py: no notifications, nothing to turn off
    _NO_MAINT = {}
SENTINEL_TIMEOUT_S = 5.0  # a Sentinel answers at once; one that hangs must not hang us
SENTINEL_QUERY = ("sentinel_username", "sentinel_password")
_SENTINEL_ERROR = re.compile(r"\)> - (?:\w+:)?(\w+)")  # "<client repr> - [network:]ConnectionError..."


def _no_reply(conn: Any) -> redis.TimeoutError:
    return redis.TimeoutError(f"timed out: no reply within {conn.socket_connect_timeout:g} s of "
                              "connecting (a hung server, or not a Redis)")


def _start(conn: Any) -> None:
    """A new connection's handshake (redis-py's on_connect: CLIENT SETINFO, and AUTH, HELLO or
    SELECT as needed, so at least one reply) under the connect timeout, the read timeout unset
    again after it: a server that accepts and never answers fails the first command instead of
    hanging it, while blocking pops later still wait as long as they ask."""
    conn._sock.settimeout(conn.socket_connect_timeout)  # the parser keeps socket_timeout (None)
    try:
        conn.on_connect()
    except redis.TimeoutError:
        raise _no_reply(conn) from None
    finally:
        if conn._sock is not None:  # None: a failed read disconnected it
            conn._sock.settimeout(conn.socket_timeout)


async def _start_async(conn: Any) -> None:
    """_start for redis.asyncio: the handshake bounded by the connect timeout with
    asyncio.timeout, not by a socket_timeout for its duration as the sync client's is: with
    one, redis-py sends under asyncio.wait_for, which in Python 3.11 drops a cancellation that
    lands as the send completes, so a caller's own timeout around a call was lost (its wait
    ran to its own end)."""
    try:
        async with asyncio.timeout(conn.socket_connect_timeout):
            await conn.on_connect()
    except (TimeoutError, redis.TimeoutError):
        raise _no_reply(conn) from None
    except redis.ConnectionError as exc:
        if isinstance(conn, aredis.SSLConnection):  # the sync client sees the TLS alert itself
            raise ClosedAfterHandshake(str(exc)) from exc
        raise


@contextmanager
def url_checked(url: str) -> Iterator[None]:
    """A Redis URL that cannot be parsed is a configuration error, not a stack trace."""
    if not isinstance(url, str) or not url:
        raise ConfigError(f"a Redis URL is needed (a non-empty str, e.g. redis://127.0.0.1:6379/0), "
                          f"got {url!r}")
    try:
        parts = urlsplit(url)
        if parts.scheme.lower() in ("redis", "rediss") and not parts.hostname:
            # redis-py would take 127.0.0.1:6379: an unset $HOST in a template must not write there
            raise ConfigError(f"Redis URL {redact_url(url)!r} names no host (e.g. "
                              "redis://127.0.0.1:6379/0)")
        yield
    except ValueError as exc:
        raise ConfigError(f"Redis URL {redact_url(url)!r} is malformed: {redact(str(exc))}") from None


def _no_master_cause(exc: BaseException) -> str:
    """redis-py's message without the long client reprs it lists: "No master found for 'm'",
    and the kinds of error of the Sentinels that could not be asked."""
    head, _, errors = first_line(exc).partition(" : ")
    kinds = _SENTINEL_ERROR.findall(errors)
    return f"{head} (Sentinels that failed: {', '.join(kinds)})" if kinds else head


@contextmanager
def redis_errors(url: str) -> Iterator[None]:
    """Turn a dead, unreachable or refusing Redis into one clear GpuqError (URL redacted)."""
    try:
        yield
    except (redis.AuthenticationError, redis.exceptions.AuthenticationWrongNumberOfArgsError) as exc:
        raise AuthenticationFailed(url, first_line(exc)) from None
    except (redis.sentinel.MasterNotFoundError, redis.asyncio.sentinel.MasterNotFoundError) as exc:
        # redis-py >= 8.2 collects a Sentinel's refusals (a plain Redis's of SENTINEL, an ACL's)
        # into this error
        raise sentinel_refusal(url, exc) or NoMaster(url, _no_master_cause(exc)) from None
    except (redis.exceptions.NoPermissionError, redis.exceptions.AuthorizationError) as exc:
        raise PermissionDenied(url, first_line(exc)) from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        cause = cause_of(exc)
        if cause is not None:
            raise TlsFailed(url, cause) from None
        line = first_line(exc)
        if url.lower().startswith("rediss") and "Timeout connecting" in line:
            # asyncio bounds connect and handshake together: either may have timed out
            line += (" (no TCP connection or no TLS handshake within the connect timeout: is the "
                     "port a TLS port?)")
        raise ConnectionFailed(url, line) from None
    except redis.exceptions.InvalidResponse as exc:  # e.g. an HTTP server's "HTTP/1.1 400 ..."
        raise ConnectionFailed(url, f"the reply is not the Redis protocol, is this a Redis server? "
                                    f"({first_line(exc)})") from None
    except redis.ResponseError as exc:
        refused = refusal(url, exc)
        if refused is None:
            raise
        raise refused from None


@dataclass(frozen=True)
class Hosts:
    """A URL that names several hosts (Sentinel, Cluster), which urllib cannot split."""

    tls: bool
    username: str | None
    password: str | None
    nodes: list[tuple[str, int]]
    path: list[str]
    query: dict[str, str]

    @classmethod
    def parse(cls, url: str, default_port: int) -> Hosts:
        parts = urlsplit(url)
        userinfo, _, hostlist = parts.netloc.rpartition("@")
        user, colon, password = userinfo.partition(":")
        nodes = [_node(h, default_port) for h in hostlist.split(",") if h]
        if not nodes:
            raise ValueError("no host:port")
        return cls(parts.scheme.startswith("rediss"), unquote(user) or None,
                   unquote(password) if colon else None, nodes,
                   [unquote(p) for p in parts.path.split("/") if p], dict(parse_qsl(parts.query)))


def _node(text: str, default_port: int) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = text.partition(":")
    if not host:
        raise ValueError(f"empty host in {text!r}")
    return host, int(port) if port else default_port


def _sentinel_args(url: str, tls: Tls) -> tuple[list[tuple[str, int]], str, dict[str, Any], dict[str, Any]]:
    """The Sentinels, the master name, the master's connection arguments and the Sentinels'."""
    hosts = Hosts.parse(url, 26379)
    if not 1 <= len(hosts.path) <= 2:
        raise ValueError("the path must be /master-name or /master-name/db")
    unknown = set(hosts.query) - set(SENTINEL_QUERY)
    if unknown:
        raise ValueError(f"unknown parameters {sorted(unknown)}; known: {', '.join(SENTINEL_QUERY)}")
    secure = {"ssl": True, **tls.options()} if hosts.tls else {}
    db = int(hosts.path[1]) if len(hosts.path) == 2 else 0
    master: dict[str, Any] = {"db": db, "username": hosts.username, "password": hosts.password, **secure}
    # no retry per Sentinel: the lookup moves on to the next one (a dead first Sentinel would
    # otherwise cost seconds of backoff on every master lookup)
    sentinels = {"socket_connect_timeout": SENTINEL_TIMEOUT_S, "socket_timeout": SENTINEL_TIMEOUT_S,
                 "retry": None, "username": hosts.query.get("sentinel_username"),
                 "password": hosts.query.get("sentinel_password"), **secure}
    return hosts.nodes, hosts.path[0], master, sentinels


def _scheme(url: str) -> str:
    return url.partition("://")[0].lower() if "://" in url else ""


def _plain_tls(url: str, tls: Tls) -> dict[str, Any]:
    """TLS arguments for a single-host URL; TLS files with a plain URL are a mistake worth
    stopping for (the connection would silently go unencrypted)."""
    scheme = _scheme(url)
    if tls and scheme not in ("rediss", "rediss+sentinel", "rediss+cluster"):
        raise ConfigError(f"TLS files were given but the Redis URL {redact_url(url)!r} is not TLS: "
                          "use rediss://")
    return {**tls.options(), "connection_class": TlsConnection} if scheme == "rediss" else {}


SINGLE_QUERY = ("db", "username", "password")  # what a redis://, rediss:// or unix:// URL may carry


def _single(url: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for a redis://, rediss:// or unix:// URL: without the TCP options for a unix
    socket (redis-py's unix connections refuse them), and a path that is not a database number
    refused (redis-py would quietly use db 0)."""
    if _scheme(url) not in ("redis", "rediss", "unix"):  # e.g. "127.0.0.1:6379", read as a path
        raise ValueError("it must start with redis://, rediss://, unix://, redis+sentinel:// or "
                         "redis+cluster:// (e.g. redis://127.0.0.1:6379/0)")
    parts = urlsplit(url)
    # only what names the database and the user: redis-py would hand other keys to the
    # connection (a traceback at the first command) or let them override gpuq's own settings
    # (?ssl_cert_reqs=none turned certificate checks off)
    unknown = sorted({k for k, _ in parse_qsl(parts.query)} - set(SINGLE_QUERY))
    if unknown:
        raise ValueError(f"unknown parameters {unknown}; known: {', '.join(SINGLE_QUERY)}")
    if _scheme(url) == "unix":
        return {k: v for k, v in kwargs.items() if k not in TCP_ONLY}
    db = unquote(parts.path).replace("/", "")  # as redis-py reads it, dropping what int() refuses
    if db and "db" not in dict(parse_qsl(parts.query)):
        try:
            int(db)
        except ValueError:
            raise ValueError(f"the database {db!r} (the path) is not a number") from None
    return kwargs


def connect(url: str, *, tls: Tls | None = None, pool: str = "default", **options: Any) -> redis.Redis:
    """A client for ``url`` (see the module docstring); ``options`` override CONNECT_OPTIONS.
    Nothing is sent until the first command: callers ping inside ``redis_errors``."""
    tls = tls or Tls()
    kwargs = {**CONNECT_OPTIONS, "health_check_interval": 30, **options}
    with url_checked(url):
        secure = _plain_tls(url, tls)
        scheme = _scheme(url)
        if scheme.endswith("+cluster"):  # cluster_client makes its own connections
            return _cluster(url, tls, pool, kwargs)
        kwargs["redis_connect_func"] = _start
        if scheme.endswith("+sentinel"):
            nodes, name, master, sentinels = _sentinel_args(url, tls)
            if master.pop("ssl", False):
                master["connection_class"] = SentinelTlsConnection
            found = redis.sentinel.Sentinel(nodes, sentinel_kwargs=sentinels)
            client: redis.Redis = found.master_for(
                name, redis_class=redis.Redis, **master, **kwargs)
            return client
        return redis.Redis.from_url(url, **_single(url, kwargs), **secure)


def connect_async(url: str, *, tls: Tls | None = None, **options: Any) -> aredis.Redis:
    """The asyncio client for ``url`` (Sentinel included; Cluster is sync only)."""
    tls = tls or Tls()
    # as many connections as calls at once, as the sync pool allows: redis-py's asyncio pool
    # stops at 100 and fails the 101st call (a service awaiting 200 results at once)
    kwargs = {**CONNECT_OPTIONS, "redis_connect_func": _start_async, **_NO_MAINT,
              "max_connections": 2**31, **options}
    with url_checked(url):
        secure = _plain_tls(url, tls)
        scheme = _scheme(url)
        if scheme.endswith("+sentinel"):
            nodes, name, master, sentinels = _sentinel_args(url, tls)
            # the Sentinels' own pools check their connections too (notifications off)
            found = redis.asyncio.sentinel.Sentinel(
                nodes, sentinel_kwargs={**sentinels, **_NO_MAINT})
            client: aredis.Redis = found.master_for(name, redis_class=aredis.Redis,
                                                    connection_pool_class=CheckedSentinelPool,
                                                    **master, **kwargs)
            return client
        if scheme.endswith("+cluster"):
            raise ConfigError("the asyncio client does not support redis+cluster:// URLs")
        secure.pop("connection_class", None)  # asyncio bounds the TLS handshake itself
        return client_from_url(url, **_single(url, kwargs), **secure)


def sentinels_of(client: redis.Redis | aredis.Redis) -> list[Any]:
    """The Sentinel clients behind a client made for a redis+sentinel:// URL (none for the
    others): closing the client leaves their connections open, so its closer closes them."""
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    return list(getattr(manager, "sentinels", ()))


def _cluster(url: str, tls: Tls, pool: str, options: dict[str, Any]) -> redis.Redis:
    from gpuq.cluster import cluster_client  # only Cluster URLs need it

    hosts = Hosts.parse(url, 6379)
    if hosts.path or hosts.query:
        raise ValueError("a cluster URL has no database or parameters")
    secure = {"ssl": True, **tls.options()} if hosts.tls else {}
    client: redis.Redis = cluster_client(hosts.nodes, pool, username=hosts.username,
                                         password=hosts.password, **options, **secure)
    return client
