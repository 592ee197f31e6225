"""Commands on a bare connection: the transport of gpuq's hot paths.

redis-py's per-command and pipeline layers (response callbacks, observability hooks, the
pipeline's command stack) cost about a sixth of an enqueue's or a claim's client time. Script
calls, the worker's ack+claim, the heartbeat, the result wait and the replay's token pops
instead pack their commands, send them and read raw replies here, under the client's retry
policy. Taking a connection from the pool and giving it back costs about as much again (the
pool's lock, fork check and observability hooks), so each client keeps one connection of its
pool for these calls, used by one thread at a time; a thread that finds it busy takes one
from the pool as before.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

import redis
from redis.retry import Retry

try:
    import hiredis
except ImportError:  # pragma: no cover - a dependency; the connection's packer serves then
    hiredis = None  # type: ignore[assignment]
try:  # what ``_bare`` reads of redis-py's hiredis parser; without it every exchange is redis-py's
    from redis._parsers.hiredis import NOT_ENOUGH_DATA
    from redis._parsers.hiredis import _HiredisParser as _Parser
    HIREDIS_PARSER: Any = _Parser
except ImportError:  # pragma: no cover - another redis-py: its own send and read serve
    HIREDIS_PARSER = NOT_ENOUGH_DATA = None


class _Kept:
    """The connection a client keeps for ``exchange`` (taken from its pool on first use, so
    the pool's ``disconnect`` closes it too) and the lock of the thread using it. A forked
    child forgets its parent's (``_forget``) and takes its own. ``poller``: a poll of the
    connection's socket (``polled``), kept for ``_bare``'s check."""

    __slots__ = ("conn", "lock", "poller", "polled")

    def __init__(self) -> None:
        self.conn: Any = None
        self.lock = threading.Lock()
        self.poller: Any = None
        self.polled: Any = None


_kept: weakref.WeakKeyDictionary[redis.Redis, _Kept] = weakref.WeakKeyDictionary()
_kept_lock = threading.Lock()


# the client last looked up and its _Kept: a worker's exchanges are all its one client's,
# and the weak dictionary's get is a Python call and a new weak reference each
_last: tuple[weakref.ref[redis.Redis], _Kept] | None = None


def _forget() -> None:
    """In a forked child: its parent's kept connections (and their locks, perhaps held by a
    thread the child lacks) are not its own. Said at the fork, not checked at each exchange:
    ``os.getpid`` is a system call, one a task on a busy worker."""
    global _kept_lock, _last
    _kept.clear()
    _kept_lock = threading.Lock()
    _last = None


os.register_at_fork(after_in_child=_forget)


def _kept_for(client: redis.Redis) -> _Kept:
    global _last
    last = _last  # one read: another thread may replace it meanwhile
    if last is not None and last[0]() is client:
        return last[1]
    kept = _kept.get(client)
    if kept is None:
        with _kept_lock:
            kept = _kept.get(client)
            if kept is None:
                kept = _kept[client] = _Kept()
    _last = (weakref.ref(client), kept)
    return kept


def exchange(client: redis.Redis, commands: Iterable[tuple[Any, ...]], *,
             retry: bool = False) -> list[Any]:
    """Send commands on one connection (the client's kept one, else one from its pool), then
    read a reply for each (a server error is returned in its place, not raised, so the
    connection stays in step); a connection left mid-way is dropped. With ``retry``, the
    commands go in one write, and a lost connection is reconnected and the whole list sent
    again under the client's retry policy, as the client's own commands are; without, each
    command is packed and sent as it is built (a stream: the server runs the first while the
    client builds the next). Raw replies: no response callbacks."""
    kept = _kept_for(client)
    if kept.lock.acquire(False):  # positional: no keyword matched in its argument parse
        try:
            conn = kept.conn
            if conn is None:
                conn = kept.conn = client.connection_pool.get_connection()
            elif retry and (bare := _bare(kept, conn)) is not None:
                listed = commands if type(commands) is list else list(commands)
                return _bare_exchange(conn, bare, pack(conn, listed), len(listed))
            else:
                check(conn)
            return _exchange_on(conn, commands, retry)
        finally:
            kept.lock.release()
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        return _exchange_on(conn, commands, retry)
    finally:
        pool.release(conn)


def check(conn: Any) -> None:
    """What the pool does to a connection it hands out, for one a caller keeps out of the
    pool: one the server closed (a restart, a timeout, a failover), or with data left unread,
    is dropped, to reconnect on its send."""
    try:
        if conn.can_read():
            conn.disconnect()
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        conn.disconnect()


def _exchange_on(conn: Any, commands: Iterable[tuple[Any, ...]], retry: bool) -> list[Any]:
    try:
        if retry:
            listed = list(commands)
            packed = pack(conn, listed)
            return conn.retry.call_with_retry(  # type: ignore[no-any-return]
                lambda: exchange_packed(conn, [(packed, len(listed))]),
                lambda _error: conn.disconnect())
        return exchange_packed(conn, ((pack(conn, [args]), 1) for args in commands))
    except BaseException:
        conn.disconnect()  # reconnected on its next use
        raise


_HIREDIS = "HiredisRespSerializer"  # redis-py's packer class when it packs with hiredis


def pack(conn: Any, commands: list[tuple[Any, ...]]) -> Any:
    """The commands in the wire protocol, as chunks for ``conn.send_packed_command``. Where
    the connection packs with hiredis, hiredis packs them here directly, in one chunk: the
    same bytes, without the packer's per-argument checks (gpuq's commands are plain names,
    strings and numbers). A command may begin and end with ``Packed`` arguments (Tail)."""
    if hiredis is not None and type(getattr(conn, "_command_packer", None)).__name__ == _HIREDIS:
        if len(commands) == 1:  # a worker's ack_claim: no list to build and join
            return [_packed(commands[0])]
        return [b"".join([_packed(args) for args in commands])]
    return conn.pack_commands([spread(args) for args in commands])


def spread(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A command's every argument, its ``Packed`` ones among them."""
    return (*args[0].args, *args[1:-1], *args[-1].args) if type(args[-1]) is Packed else args


def _packed(args: tuple[Any, ...]) -> bytes:
    if type(args[-1]) is not Packed:
        return hiredis.pack_command(args)  # type: ignore[no-any-return]
    head, middle, tail = args[0], args[1:-1], args[-1]
    between = hiredis.pack_command(middle) if middle else b"\n"
    return b"*%d\r\n%b%b%b" % (len(head.args) + len(middle) + len(tail.args), head.wire(),
                               between[between.index(b"\n") + 1:], tail.wire())


class Packed:
    """Arguments many commands repeat, put in the wire protocol once: hiredis formats each
    argument's length with ``sprintf``, and packing a busy worker's ``ack_claim`` (32
    arguments: the script's name and keys and the claim's 23 the same at every task) was
    about a tenth of its instructions per task."""

    __slots__ = ("args", "_wire")

    def __init__(self, args: list[Any]) -> None:
        self.args = args
        self._wire = b""

    def wire(self) -> bytes:
        if not self._wire:  # hiredis is there: only its packing reads this
            packed = hiredis.pack_command(tuple(self.args))
            self._wire = packed[packed.index(b"\n") + 1:]  # without the count of arguments
        return self._wire


class Tail:
    """The ``Packed`` arguments of a sender's commands: their heads (the command and the
    script's name and keys), and the arguments they last ended with, kept while they do."""

    def __init__(self) -> None:
        self._heads: dict[tuple[Any, ...], Packed] = {}  # a few: one a script and command
        self._kept: Packed | None = None

    def command(self, head: tuple[Any, ...], args: list[Any], start: int) -> tuple[Any, ...]:
        """``head`` then ``args``: the head Packed, and those from ``start`` on as the kept
        Packed when they are the same (an equal list: a kept call's, the same strings)."""
        tail, kept = args[start:], self._kept
        if kept is None or kept.args != tail:
            kept = self._kept = Packed(tail)
        packed = self._heads.get(head)
        if packed is None:
            packed = self._heads[head] = Packed(list(head))
        return (packed, *args[:start], kept)


def kept_connection(client: redis.Redis) -> Any:
    """The connection ``client`` keeps for ``exchange`` in this process (None before its
    first call)."""
    return _kept_for(client).conn


def exchange_packed(conn: Any, sends: Iterable[tuple[Any, int]]) -> list[Any]:
    """Send packed commands (each send: its chunks and how many commands they hold) on one
    connection, then read a reply for each command; a server error is returned in its
    place, not raised, so the connection stays in step."""
    n = 0
    for chunks, count in sends:
        # a health check's PING would read an earlier command's reply as its own
        conn.send_packed_command(chunks, check_health=n == 0)
        n += count
    return read_replies(conn, n)


def read_replies(conn: Any, n: int) -> list[Any]:
    """n replies from a connection; a server error in its reply's place."""
    replies: list[Any] = []
    for _ in range(n):
        try:
            replies.append(conn.read_response())
        except redis.exceptions.ResponseError as exc:
            replies.append(exc)
    return replies


# The worker's ack+claim, the heartbeat and the scripts' calls go on the kept connection
# without redis-py's send and read around it (per exchange: the pool's check through three
# layers and a new poll object, the health check, a host string built for each reply's error
# message, the parser's loop): about a fifth of a busy worker's instructions per task. Same
# bytes, same replies, same faults: a connection error or timeout drops the connection
# under the client's retry policy; a server error is a reply. A connection class with its
# own send or read (Sentinel's reads READONLY as a failover, gpuq.cluster's reads MOVED),
# another parser, one not yet connected or due a health check goes through redis-py's.
_SEND = redis.connection.AbstractConnection.send_packed_command
_READ = redis.connection.AbstractConnection.read_response
_CLOSED = "Connection closed by server."  # redis-py's words
_CONNECTION_ERROR = redis.ConnectionError  # read twice a reply: no module attribute lookups
_bare_kinds: dict[type, bool] = {}


def _bare(kept: _Kept, conn: Any) -> tuple[Any, Any, Any] | None:
    """The kept connection's socket, hiredis reader and parser when its exchange may go bare
    (``_bare_exchange``), after the pool's check of it (``check``: one the server closed or
    with data left unread is dropped, then None); None when it goes through redis-py's."""
    kind = type(conn)
    plain = _bare_kinds.get(kind)
    if plain is None:
        plain = _bare_kinds[kind] = (HIREDIS_PARSER is not None and kind.send_packed_command is _SEND
                                     and kind.read_response is _READ)
    sock, parser = conn._sock, conn._parser
    if not plain or sock is None or type(parser) is not HIREDIS_PARSER or parser._reader is None:
        return None
    if conn.health_check_interval and time.monotonic() > conn.next_health_check:
        return None
    if kept.polled is not sock:  # a new socket: polled by a poll of its own from now on
        kept.poller = select.poll()
        kept.poller.register(sock, select.POLLIN)
        kept.polled = sock
    # TLS: decrypted bytes may wait above the socket, where poll does not see them
    if (parser._reader.has_data() or kept.poller.poll(0)
            or (type(sock) is not socket.socket and sock.pending())):
        conn.disconnect()
        return None
    return sock, parser._reader, parser


def _bare_exchange(conn: Any, bare: tuple[Any, Any, Any], chunks: list[bytes], n: int) -> list[Any]:
    """``_exchange_on`` with ``retry`` for a connection ``_bare`` passed (its packed commands,
    n of them): its first attempt bare, a retry (reconnected) through redis-py's send and
    read. Under a policy of no retries (gpuq's own connections) the attempt is made without
    ``call_with_retry``, which would drop the connection and raise as the caller does."""
    data = b"".join(chunks) if len(chunks) > 1 else chunks[0]
    try:
        policy = conn.retry
        if type(policy) is Retry and policy._retries == 0:
            return _send_read(conn, *bare, data, n)

        def attempt() -> list[Any]:
            if conn._sock is bare[0]:
                return _send_read(conn, *bare, data, n)
            return exchange_packed(conn, [(chunks, n)])

        return policy.call_with_retry(  # type: ignore[no-any-return]
            attempt, lambda _error: conn.disconnect())
    except BaseException:
        conn.disconnect()  # reconnected on its next use
        raise


def _send_read(conn: Any, sock: Any, reader: Any, parser: Any, data: bytes, n: int) -> list[Any]:
    """Send ``data`` (n commands) on the connection's socket, then read n replies, as
    redis-py's ``send_packed_command`` and ``read_response`` would (its push messages
    handled by its parser); a fault raised as theirs are (the caller drops the connection)."""
    try:
        sock.sendall(data)
    except OSError as exc:
        raise _fault(exc, "Timeout writing to socket",
                     f"Error {exc.errno} while writing to socket. {exc.strerror}.") from exc
    replies: list[Any] = []
    # redis-py 6 has no push type on this parser (RESP2 brings no push messages)
    push, buffer = getattr(parser, "_hiredis_PushNotificationType", None), parser._buffer
    try:
        while len(replies) < n:
            reply = reader.gets()
            while reply is NOT_ENOUGH_DATA:
                got = sock.recv_into(buffer)
                if not got:
                    raise redis.ConnectionError(_CLOSED)
                reader.feed(buffer, 0, got)
                reply = reader.gets()
            if push is not None and type(reply) is push:
                parser.handle_push_response(reply)
                continue
            if isinstance(reply, _CONNECTION_ERROR):  # e.g. LOADING: raised, as the parser does
                raise reply
            if type(reply) is list and reply and isinstance(reply[0], _CONNECTION_ERROR):
                raise reply[0]
            replies.append(reply)
    except OSError as exc:
        where = conn._host_error()
        raise _fault(exc, f"Timeout reading from {where}",
                     f"Error while reading from {where} : {exc.args}") from exc
    if conn.health_check_interval:
        conn.next_health_check = time.monotonic() + conn.health_check_interval
    return replies


def _fault(exc: OSError, timed_out: str, failed: str) -> redis.RedisError:
    """redis-py's error for a socket's: its own timeout (no errno) a TimeoutError, the
    rest (an OS-level ETIMEDOUT among them: the connection is dead) a ConnectionError."""
    if isinstance(exc, TimeoutError) and exc.errno is None:
        return redis.TimeoutError(timed_out)
    return redis.ConnectionError(failed)
