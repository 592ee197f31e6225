"""URLs to clients, Redis faults to one-line errors, credentials masked (no server needed)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio.sentinel
import redis.sentinel

from gpuq.aio import AsyncQueue
from gpuq.client import Queue
from gpuq.config import Config
from gpuq.connection import (
    CONNECT_OPTIONS,
    Hosts,
    connect,
    connect_async,
    denied,
    redis_errors,
)
from gpuq.errors import (
    AuthenticationFailed,
    ConfigError,
    ConnectionFailed,
    NoMaster,
    PermissionDenied,
    ServerRefused,
    TlsFailed,
)
from gpuq.redact import redact, redact_url
from gpuq.tls import SentinelTlsConnection, Tls, TlsConnection

SECRET = "s3cret"


@pytest.mark.parametrize(("text", "shown"), [
    ("redis://:s3cret@host:6380/0", "redis://:***@host:6380/0"),
    ("rediss://user:s3cret@host/1", "rediss://user:***@host/1"),
    ("error at redis://u:s3cret@h:1/0: boom", "error at redis://u:***@h:1/0: boom"),
    ("redis+sentinel://:s3cret@a:26379,b:26380/mymaster/2",
     "redis+sentinel://:***@a:26379,b:26380/mymaster/2"),
    ("redis://:p@ss/w0rd@host:6379/0", "redis://:***@host:6379/0"),  # unencoded @ and /
    ("redis+sentinel://h:1/m?sentinel_password=s3cret&x=1", "redis+sentinel://h:1/m?sentinel_password=***&x=1"),
    ("redis://h:1/0?password=s3cret", "redis://h:1/0?password=***"),
    # a message going on after a query password keeps its colon, redacted once or twice
    ("at redis+sentinel://h:1/m?sentinel_password=s3cret: boom",
     "at redis+sentinel://h:1/m?sentinel_password=***: boom"),
    ("redis://h:1/0?password=s3c:ret:: boom", "redis://h:1/0?password=***: boom"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("redis://name@host:6379/0", "redis://name@host:6379/0"),  # a user name alone is not secret
    ("mail me at a@b.c, ratio 3:4", "mail me at a@b.c, ratio 3:4"),
    # found by a security review: a percent-encoded name (the parsers decode it and log in)
    ("redis://u@h:1/0?%70assword=s3cret", "redis://u@h:1/0?%70assword=***"),
    ("redis+sentinel://h:1/m?sentinel_pass%77ord=s3cret&db=1", "redis+sentinel://h:1/m?sentinel_pass%77ord=***&db=1"),
    ("redis://h:1/0?db=2&socket_timeout=3", "redis://h:1/0?db=2&socket_timeout=3"),
])
def test_redact_masks_passwords_only(text: str, shown: str) -> None:
    assert redact(text) == shown
    assert redact(shown) == shown
    assert redact_url(text) == shown or " " in text


def test_errors_carry_the_masked_url() -> None:
    for error in (ConnectionFailed, AuthenticationFailed, TlsFailed, NoMaster, PermissionDenied):
        exc = error("redis://u:s3cret@h:1/0", "cause with redis://:s3cret@other/0")
        assert SECRET not in str(exc) and SECRET not in exc.url and SECRET not in exc.cause, error
    assert str(AuthenticationFailed("redis://:s3cret@h:1/0", "WRONGPASS")) == \
        "authentication failed for Redis at redis://:***@h:1/0: WRONGPASS"


def _raised_by(exc: BaseException, url: str = "redis://:s3cret@h:1/0") -> BaseException:
    with pytest.raises(Exception) as info:
        with redis_errors(url):
            raise exc
    return info.value


def _ssl_wrapped(inner: BaseException) -> redis.ConnectionError:
    """What redis-py raises: a ConnectionError while handling the ssl error."""
    try:
        raise inner
    except OSError:
        try:
            raise redis.ConnectionError("Error 1 connecting to h:1. [SSL] ...")
        except redis.ConnectionError as exc:
            return exc
    raise AssertionError("unreachable")


def test_redis_errors_name_the_fault() -> None:
    cases: list[tuple[BaseException, type[BaseException], str]] = [
        (redis.AuthenticationError("invalid username-password pair or user is disabled."),
         AuthenticationFailed, "authentication failed for Redis at redis://:***@h:1/0: invalid"),
        (redis.AuthenticationError("Authentication required."), AuthenticationFailed,
         "Authentication required"),
        (redis.sentinel.MasterNotFoundError(  # redis-py 8, and 5's repr
            "No master found for 'm' : <Redis<Conn(host=h,port=1)>)> - network:ConnectionError, "
            "<Redis<Conn(host=h,port=2)>)> - TimeoutError('Timeout connecting')"),
         NoMaster, "No master found for 'm' (Sentinels that failed: ConnectionError, TimeoutError)"),
        (redis.asyncio.sentinel.MasterNotFoundError("No master found for 'm'"), NoMaster, "for 'm'"),
        (redis.exceptions.NoPermissionError("NOPERM this user has no permissions to run the 'get' command"),
         PermissionDenied, "refused a command to this user: NOPERM"),
        (redis.ResponseError("The user executing the script can't run this command or subcommand"),
         PermissionDenied, "can't run this command"),
        (redis.ConnectionError("Error 111 connecting to h:1. Connection refused."), ConnectionFailed,
         "cannot reach Redis at redis://:***@h:1/0: Error 111"),
        (redis.TimeoutError("Timeout connecting to server"), ConnectionFailed, "Timeout connecting"),
        (_ssl_wrapped(ssl.SSLCertVerificationError(1, "certificate verify failed")), TlsFailed,
         "TLS handshake with Redis at redis://:***@h:1/0 failed: certificate verify failed"),
        (redis.exceptions.InvalidResponse('Protocol error, got "H" as reply type byte'), ConnectionFailed,
         'cannot reach Redis at redis://:***@h:1/0: the reply is not the Redis protocol, is this a Redis'),
        (redis.exceptions.ReadOnlyError("You can't write against a read only replica."), ServerRefused,
         "Redis at redis://:***@h:1/0 refused the command: it is a read-only replica"),
        (redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
         ServerRefused, "refused the command: it is out of memory"),
        (redis.ResponseError("Error running script (call to f_1): @user_script:1: OOM command not "
                             "allowed when used memory > 'maxmemory'."), ServerRefused, "out of memory"),
        # regression: passed through as a bare ResponseError (a CLI traceback, exit 1)
        (redis.ResponseError("MISCONF Redis is configured to save RDB snapshots, but it's currently "
                             "unable to persist to disk."), ServerRefused, "cannot save to disk (MISCONF)"),
        (redis.ResponseError("BUSY Redis is busy running a script. You can only call SCRIPT KILL or "
                             "SHUTDOWN NOSAVE."), ServerRefused, "busy running a long script"),
        # found by an operator's drill: a traceback, exit 1, from the CLI
        (redis.ResponseError("NOREPLICAS Not enough good replicas to write."), ServerRefused,
         "fewer replicas in reach than min-replicas-to-write asks (NOREPLICAS)"),
        (redis.ResponseError("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set "
                             "to 'no'."), ServerRefused, "a replica that lost its master (MASTERDOWN)"),
        (redis.ResponseError("LOADING Redis is loading the dataset in memory"), ServerRefused,
         "loading its data (LOADING)"),
        # found by a security review: a pool key another role wrote with another type
        (redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
         ServerRefused, "holds another type of value than gpuq writes (WRONGTYPE)"),
        (redis.ResponseError("DB index is out of range"), ConfigError,
         "Redis URL 'redis://:***@h:1/0' names a database the server does not have"),
        (redis.ResponseError("unknown command 'SENTINEL', with args beginning with: 'MASTERS' "),
         NoMaster, "no master from the Sentinels at redis://:***@h:1/0: it is a plain Redis"),
    ]
    for exc, kind, fragment in cases:
        raised = _raised_by(exc)
        assert type(raised) is kind, (exc, raised)
        assert fragment in str(raised), str(raised)
        assert SECRET not in str(raised)
        assert raised.__cause__ is None and raised.__suppress_context__


def test_other_server_errors_pass_through() -> None:
    error = redis.ResponseError("BUSYGROUP Consumer Group name already exists")
    assert _raised_by(error) is error


def test_hosts_of_a_sentinel_url() -> None:
    hosts = Hosts.parse("rediss+sentinel://us%40r:p%3Aw@a:1,[::1]:2,b/master/3?sentinel_password=x", 26379)
    assert hosts.tls and hosts.username == "us@r" and hosts.password == "p:w"
    assert hosts.nodes == [("a", 1), ("::1", 2), ("b", 26379)]
    assert hosts.path == ["master", "3"] and hosts.query == {"sentinel_password": "x"}


def test_sentinel_url_gives_a_master_client() -> None:
    client = connect("redis+sentinel://:pw@127.0.0.1:1,127.0.0.1:2/mymaster/2?sentinel_password=sp")
    pool: Any = client.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert pool.service_name == "mymaster" and pool.is_master
    kwargs = pool.connection_kwargs
    assert kwargs["db"] == 2 and kwargs["password"] == "pw" and kwargs["decode_responses"]
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [1, 2]
    assert sentinels[0].connection_pool.connection_kwargs["password"] == "sp"
    assert sentinels[0].connection_pool.connection_kwargs["retry"] is None  # next Sentinel at once
    client.close()


def test_tls_sentinel_url_uses_tls_to_master_and_sentinels(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not read before a connection is made")
    client = connect("rediss+sentinel://h:1/m", tls=Tls(ca=str(ca)))
    pool: Any = client.connection_pool
    assert pool.connection_class is SentinelTlsConnection
    assert pool.connection_kwargs["ssl_ca_certs"] == str(ca)
    sentinel_kwargs = pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
    assert sentinel_kwargs["ssl_ca_certs"] == str(ca)
    client.close()


@pytest.mark.parametrize(("url", "fragment"), [
    ("redis+sentinel://h:1", "master-name"),
    ("redis+sentinel://h:1/m/0/extra", "master-name"),
    ("redis+sentinel://h:1/m?sentinel_pasword=x", "unknown parameters"),
    ("redis+sentinel://:s3cret@/m", "no host"),
    ("redis+sentinel://:s3cret@h:port/m", "invalid literal"),
    ("redis://:s3cret@h:port/0", "Port could not be cast"),
    ("redis://:s3cret@h:1/abc", "the database 'abc' \\(the path\\) is not a number"),
    ("rediss://:s3cret@h:1/0x", "the database '0x'"),
    # regressions: an unknown key went to the connection (a traceback at the first command),
    # and an ssl_* key overrode the certificate checks gpuq always asks for
    ("redis://:s3cret@h:1/0?foo=bar", "unknown parameters \\['foo'\\]"),
    ("rediss://:s3cret@h:1/0?ssl_cert_reqs=none", "unknown parameters \\['ssl_cert_reqs'\\]"),
    ("unix:///tmp/x.sock?db=1&socket_timeout=1", "unknown parameters \\['socket_timeout'\\]"),
    # found by a QA pass: a URL naming no host went to 127.0.0.1:6379 (an unset $HOST in a
    # template wrote tasks into whatever Redis ran there)
    ("redis://", "names no host"), ("redis:///0", "names no host"),
    ("redis://:s3cret@:6395/0", "names no host"), ("rediss://", "names no host"),
])
def test_malformed_urls_are_configuration_errors(url: str, fragment: str) -> None:
    for make in (connect, connect_async):
        with pytest.raises(ConfigError, match=fragment) as info:
            make(url)
        assert SECRET not in str(info.value)


def test_database_numbers_redis_py_reads() -> None:
    """A number, or ?db=, or no path at all are databases; -1 is the server's to refuse."""
    for url, db in (("redis://h:1/3", 3), ("redis://h:1/x?db=2", 2), ("redis://h:1", 0),
                    ("redis://h:1/-1", -1)):
        assert connect(url).connection_pool.connection_kwargs.get("db", 0) == db, url


def test_unix_socket_urls_take_no_tcp_options() -> None:
    """redis-py's unix socket connections refuse socket_keepalive (a TypeError at first use)."""
    sync = connect("unix:///tmp/gpuq-none.sock?db=1").connection_pool
    asynchronous = connect_async("unix:///tmp/gpuq-none.sock").connection_pool
    for pool in (sync, asynchronous):
        assert "socket_keepalive" not in pool.connection_kwargs
        assert pool.connection_kwargs["socket_connect_timeout"] == 5
        pool.make_connection()  # would raise the TypeError
    assert sync.connection_kwargs["db"] == 1


def test_tls_files_are_checked_and_need_rediss(tmp_path: Path) -> None:
    pem = tmp_path / "x.pem"
    pem.write_text("x")
    with pytest.raises(ConfigError, match="--tls-ca '/nonexistent/ca.pem': no such readable file"):
        connect("rediss://h:1/0", tls=Tls(ca="/nonexistent/ca.pem"))
    with pytest.raises(ConfigError, match="--tls-key needs --tls-cert"):
        connect("rediss://h:1/0", tls=Tls(key=str(pem)))
    with pytest.raises(ConfigError, match="is not TLS: use rediss://") as info:
        connect("redis://:s3cret@h:1/0", tls=Tls(ca=str(pem)))
    assert SECRET not in str(info.value)
    client = connect("rediss://h:1/0", tls=Tls(ca=str(pem), cert=str(pem), key=str(pem)))
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class is TlsConnection
    assert (kwargs["ssl_ca_certs"], kwargs["ssl_certfile"], kwargs["ssl_keyfile"]) == (str(pem),) * 3
    assert kwargs["ssl_cert_reqs"] == "required"
    client.close()


def test_queue_from_url_takes_tls_from_its_config(tmp_path: Path) -> None:
    pem = tmp_path / "ca.pem"
    pem.write_text("x")
    with Queue.from_url("rediss://h:1/0", pool="p", config=Config(tls_ca=str(pem))) as queue:
        assert queue.redis.connection_pool.connection_kwargs["ssl_ca_certs"] == str(pem)


def test_async_client_of_each_url_kind() -> None:
    sentinel: Any = connect_async("redis+sentinel://h:1/m").connection_pool
    assert isinstance(sentinel, redis.asyncio.sentinel.SentinelConnectionPool)
    secure: Any = connect_async("rediss+sentinel://h:1/m").connection_pool
    assert secure.connection_class is redis.asyncio.sentinel.SentinelManagedSSLConnection
    plain = connect_async("rediss://h:1/0")
    assert plain.connection_pool.connection_kwargs["ssl_cert_reqs"] == "required"
    with pytest.raises(ConfigError, match="does not support redis\\+cluster"):
        connect_async("redis+cluster://h:1")


def test_cluster_urls_go_to_gpuq_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake(nodes: list[tuple[str, int]], pool: str, **options: Any) -> str:
        seen.update(nodes=nodes, pool=pool, **options)
        return "cluster client"

    import gpuq.cluster

    monkeypatch.setattr(gpuq.cluster, "cluster_client", fake)
    assert connect("redis+cluster://u:pw@a:7000,b:7001", pool="p") == "cluster client"  # type: ignore[comparison-overlap]
    assert seen["nodes"] == [("a", 7000), ("b", 7001)] and seen["pool"] == "p"
    assert seen["username"] == "u" and seen["password"] == "pw" and "ssl" not in seen


def test_tls_handshake_with_a_silent_port_times_out() -> None:
    """rediss:// to a port that never speaks TLS fails after the connect timeout instead
    of waiting forever (gpuq clients have no read timeout)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        client = connect(f"rediss://127.0.0.1:{port}/0", socket_connect_timeout=0.3, retry=None)
        started = time.monotonic()
        with pytest.raises(TlsFailed, match="no TLS handshake within the connect timeout"):
            with redis_errors(f"rediss://127.0.0.1:{port}/0"):
                client.ping()
        assert time.monotonic() - started < 3
        client.close()


def test_async_tls_to_a_silent_port_names_both_causes() -> None:
    """asyncio bounds the TCP connect and the TLS handshake with one timeout, so its error
    cannot tell them apart: the message names both instead of a bare "Timeout connecting"."""
    async def ping(port: int) -> None:
        client = connect_async(f"rediss://127.0.0.1:{port}/0", socket_connect_timeout=0.3, retry=None)
        try:
            with redis_errors(f"rediss://127.0.0.1:{port}/0"):
                await client.ping()
        finally:
            await client.aclose()

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        with pytest.raises(ConnectionFailed, match="no TCP connection or no TLS handshake"):
            asyncio.run(ping(silent.getsockname()[1]))


@pytest.fixture
def fake_server() -> Iterator[Callable[[bytes | None], int]]:
    """Start a TCP server on a free port that answers every read with ``reply`` (None: never
    answers); returns its port."""
    opened: list[socket.socket] = []

    def start(reply: bytes | None) -> int:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        opened.append(listener)

        def serve() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                opened.append(conn)
                if reply is not None:
                    try:
                        conn.recv(65536)
                        conn.sendall(reply)
                    except OSError:
                        pass

        threading.Thread(target=serve, daemon=True).start()
        return int(listener.getsockname()[1])

    yield start
    for sock in opened:
        sock.close()


def _enqueue_async(url: str) -> None:
    async def go() -> None:
        async with AsyncQueue.from_url(url) as queue:
            await asyncio.wait_for(queue.enqueue("h", None, model="m", vram_gb=1), 10)

    asyncio.run(go())


def test_silent_server_fails_the_first_command_in_the_connect_timeout(
        fake_server: Callable[[bytes | None], int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that accepts and never answers: the handshake of a new connection runs under
    the connect timeout (gpuq has no read timeout), so the first command fails instead of
    hanging, from the sync and the asyncio API alike."""
    monkeypatch.setitem(CONNECT_OPTIONS, "socket_connect_timeout", 0.3)
    url = f"redis://:{SECRET}@127.0.0.1:{fake_server(None)}/0"
    for first_use in (lambda: connect(url).ping(),
                      lambda: Queue.from_url(url).enqueue("h", None, model="m", vram_gb=1),
                      lambda: _enqueue_async(url)):
        started = time.monotonic()
        with pytest.raises(ConnectionFailed, match="timed out: no reply within 0.3 s of connecting") as info:
            with redis_errors(url):
                first_use()
        assert time.monotonic() - started < 3
        assert type(info.value) is ConnectionFailed and SECRET not in str(info.value)


def test_not_a_redis_server(fake_server: Callable[[bytes | None], int]) -> None:
    """An HTTP server on the port: one ConnectionFailed that asks, not a protocol error."""
    port = fake_server(b"HTTP/1.0 400 Bad Request\r\n\r\n")
    url = f"redis://127.0.0.1:{port}/0"
    for first_use in (lambda: Queue.from_url(url).enqueue("h", None, model="m", vram_gb=1),
                      lambda: _enqueue_async(url)):
        with pytest.raises(ConnectionFailed, match="is this a Redis server"):
            first_use()


def test_closing_a_queue_closes_its_sentinel_clients_too() -> None:
    """Regression: close() (and a `with` block's end) left the Sentinel connections open."""
    from gpuq.aio import AsyncQueue
    from gpuq.client import Queue
    from gpuq.connection import sentinels_of

    closed: list[str] = []
    sync = Queue(connect("redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster"), Config())
    assert len(sentinels_of(sync.redis)) == 2
    for i, sentinel in enumerate(sentinels_of(sync.redis)):
        sentinel.close = lambda i=i: closed.append(f"sync{i}")  # type: ignore[method-assign]
    sync.close()

    async def close_async() -> None:
        q = AsyncQueue(connect_async("redis+sentinel://127.0.0.1:1/mymaster"), Config())

        async def aclose() -> None:
            closed.append("async")

        for sentinel in sentinels_of(q.redis):
            sentinel.aclose = aclose
        await q.close()

    asyncio.run(close_async())
    assert closed == ["sync0", "sync1", "async"]
    assert sentinels_of(connect("redis://127.0.0.1:1/0")) == []


def test_a_pool_name_that_would_split_an_acl_rule_is_refused() -> None:
    """Regression: a tab in the pool went into `gpuq acl`'s rule line, which redis-cli split
    into extra rules (a key pattern of all keys)."""
    for pool in ("x\tallkeys", 'a"b', "a'b", "a b"):
        with pytest.raises(ConfigError, match="without braces, colons, quotes or spaces"):
            Config(pool=pool).validate()


@pytest.mark.parametrize("url", [None, "", 6379])
def test_a_missing_url_is_a_config_error(url: object) -> None:
    """Regression: Queue.from_url(None) raised a TypeError from deep in the URL parsing."""
    from gpuq import Queue
    from gpuq.aio import AsyncQueue

    for make in (Queue.from_url, AsyncQueue.from_url):
        with pytest.raises(ConfigError, match="a Redis URL is needed"):
            make(url)  # type: ignore[arg-type]


def test_a_queue_made_from_a_client_checks_its_config_before_any_write() -> None:
    """Regression: Queue(client, Config(pool="a b")) and memory_queue(pool="a}{") were taken
    and wrote keys under pool names from_url refuses (one of them two hash tags)."""
    import fakeredis

    from gpuq import Queue
    from gpuq.testing import memory_queue

    client = fakeredis.FakeRedis(decode_responses=True)
    for config in (Config(pool="a b"), Config(pool="a}{"), Config(pool="p", lease_s=-1)):
        with pytest.raises(ConfigError):
            Queue(client, config).enqueue("h", None, model="m", vram_gb=1)
    for pool in ("", "a b"):
        with pytest.raises(ConfigError):
            memory_queue(pool=pool)
    assert client.keys("*") == []


def test_a_reaper_refused_by_the_acl_exits_instead_of_retrying(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a running reaper took NOPERM for an outage and retried until killed."""
    import fakeredis
    import redis

    from gpuq.errors import PermissionDenied
    from gpuq.reaper.loop import Reaper

    reaper = Reaper(fakeredis.FakeRedis(decode_responses=True), Config(pool="p").validate())

    def refused() -> bool:
        raise redis.exceptions.NoPermissionError("this user has no permissions to run the 'fcall' command")

    monkeypatch.setattr(reaper, "lead", refused)
    with pytest.raises(PermissionDenied):
        reaper.run()


def test_async_pools_check_their_connections_and_have_no_small_bound() -> None:
    """The asyncio pools (the Sentinels' own too) check a connection before handing it out
    (no maintenance notifications; gpuq.aio_pool), and allow as many connections as calls
    at once, as the sync pool does (redis-py's asyncio pool stops at 100)."""
    from gpuq.aio_pool import CheckedPool, CheckedSentinelPool
    from gpuq.connection import connect_async

    plain = connect_async("redis://127.0.0.1:1/0")
    assert isinstance(plain.connection_pool, CheckedPool) and plain.connection_pool.max_connections >= 2**31
    sentinel = connect_async("redis+sentinel://127.0.0.1:1/m")
    pool = sentinel.connection_pool
    assert isinstance(pool, CheckedSentinelPool) and pool.max_connections >= 2**31
    assert not any(s.connection_pool.maint_notifications_enabled() for s in pool.sentinel_manager.sentinels)


def test_a_sentinels_acl_refusal_is_a_permission_error_not_no_master() -> None:
    """Found by a QA pass: redis-py 8.2 collects a Sentinel's NOPERM into MasterNotFoundError,
    which read as "no master" (an outage a reaper retries) instead of the ACL's refusal."""
    url = "redis+sentinel://127.0.0.1:26379/m?sentinel_password=pw"
    refusal = ("No master found for 'm' : <redis.client.Redis(...)> - NoPermissionError: this user "
               "has no permissions to run the 'sentinel|masters' command")
    with pytest.raises(PermissionDenied, match="no permissions to run the 'sentinel|masters'") as got:
        with redis_errors(url):
            raise redis.sentinel.MasterNotFoundError(refusal)
    assert "pw" not in str(got.value) and "NoPermissionError" not in str(got.value)
    assert denied(redis.sentinel.MasterNotFoundError(refusal))
    assert not denied(redis.sentinel.MasterNotFoundError("No master found for 'm'"))


def test_a_server_that_does_not_know_a_command_is_a_one_line_config_error() -> None:
    """Found by a QA pass: redis:// at a Sentinel's port was a traceback ending in "unknown
    command 'TIME'"."""
    with pytest.raises(ConfigError, match="does not know the command TIME: is it a Redis server"):
        with redis_errors("redis://127.0.0.1:26379/0"):
            raise redis.ResponseError("unknown command 'TIME', with args beginning with: ")


def test_a_sentinels_login_or_certificate_failure_is_named_not_no_master() -> None:
    """Found by a QA pass: redis-py 8.2 collects a Sentinel's refused login (a wrong or missing
    ``sentinel_password``) and a failed certificate check into MasterNotFoundError, which
    read "no master ... (Sentinels that failed: AuthenticationError)" or "ConnectionError"."""
    url = "rediss+sentinel://:mpw@127.0.0.1:1,127.0.0.1:2/m?sentinel_password=spw"
    login = ("No master found for 'm' : <redis.client.Redis(<...>)> - auth:AuthenticationError: "
             "invalid username-password pair or user is disabled., <redis.client.Redis(<...>)> - "
             "auth:AuthenticationError: invalid username-password pair or user is disabled.")
    with pytest.raises(AuthenticationFailed, match=r"a Sentinel refused the login .*: invalid "
                       r"username-password pair or user is disabled\.$") as got:
        with redis_errors(url):
            raise redis.sentinel.MasterNotFoundError(login)
    assert "spw" not in str(got.value) and "mpw" not in str(got.value) and "<redis" not in str(got.value)
    assert denied(redis.sentinel.MasterNotFoundError(login))
    tls = ("No master found for 'm' : <redis.client.Redis(<...>)> - network:ConnectionError: Error 1 "
           "connecting to 127.0.0.1:1. [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
           "self-signed certificate in certificate chain (_ssl.c:1006).")
    with pytest.raises(TlsFailed, match=r"failed: with a Sentinel: certificate verify failed: "
                       r"self-signed certificate in certificate chain$"):
        with redis_errors(url):
            raise redis.sentinel.MasterNotFoundError(tls)
    assert not denied(redis.sentinel.MasterNotFoundError(tls))


@pytest.mark.parametrize("url", [
    "redis://:Qx7 Zq9 Wk4@127.0.0.1:1/0",
    "redis://user:Qx7 Zq9@Wk4 Vb@127.0.0.1:1/0",
    "redis://127.0.0.1:1/0?password=Qx7 Zq9 Wk4",
    "redis+sentinel://:Qx7 Zq9 Wk4@127.0.0.1:1/m?sentinel_password=Qx7 Zq9 Wk4",
])
def test_a_password_with_spaces_never_shows_in_an_error(url: str) -> None:
    """Found by a QA pass: an unencoded space in a URL's password (which redis-py still sends)
    ended the free-text masking, and the CLI printed "authentication failed for Redis at
    redis://:Se Cr Et@..."."""
    for error in (ConnectionFailed(url, "refused"), PermissionDenied(url, "NOPERM"),
                  NoMaster(url, "none")):
        shown = str(error)
        assert not any(w in shown for w in ("Qx7", "Zq9", "Wk4")) and "***" in shown, shown
        assert "127.0.0.1:1" in shown
    with pytest.raises(ConfigError) as got:
        connect(url + ("&" if "?" in url else "?") + "bogus=1")
    assert not any(w in str(got.value) for w in ("Qx7", "Zq9", "Wk4")), str(got.value)


@pytest.mark.parametrize("url", ["127.0.0.1:6379", "10.0.0.5:6379/0", "localhost:6379", "http://h:1/0"])
def test_a_url_without_a_redis_scheme_says_so(url: str) -> None:
    """Found by a QA pass: "--redis 127.0.0.1:6379" (no scheme) said "the database
    '127.0.0.1:6379' (the path) is not a number"."""
    for make in (connect, connect_async):
        with pytest.raises(ConfigError, match="it must start with redis://"):
            make(url)


def test_a_client_certificate_without_its_key_is_named(tmp_path: Path) -> None:
    """Found by a QA pass: --tls-cert without --tls-key (or the two swapped) said only
    "failed: [ssl] pem lib (_ssl.c:3926)"."""
    cert = tmp_path / "client.crt"
    cert.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    context = ssl.create_default_context()
    try:
        context.load_cert_chain(str(cert))
    except ssl.SSLError as exc:
        error = redis.ConnectionError("Error connecting")
        error.__cause__ = exc
    with pytest.raises(TlsFailed, match="the client certificate or key could not be loaded"):
        with redis_errors("rediss://127.0.0.1:1/0"):
            raise error
