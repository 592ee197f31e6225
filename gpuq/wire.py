"""Commands on a bare pooled connection: the transport of gpuq's hot paths.

redis-py's per-command and pipeline layers (response callbacks, observability hooks, the
pipeline's command stack) cost about a sixth of an enqueue's or a claim's client time. Script
calls, the worker's ack+claim, the heartbeat, the result wait and the replay's token pops
instead pack their commands with the connection's own packer, send them and read raw
replies here, under the client's retry policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis


def exchange(client: redis.Redis, commands: Iterable[tuple[Any, ...]], *,
             retry: bool = False) -> list[Any]:
    """Send commands on one pooled connection, then read a reply for each (a server error is
    returned in its place, not raised, so the connection stays in step); a connection left
    mid-way is dropped. With ``retry``, the commands go in one write, and a lost connection
    is reconnected and the whole list sent again under the client's retry policy, as the
    client's own commands are; without, each command is packed and sent as it is built (a
    stream: the server runs the first while the client builds the next). Raw replies: no
    response callbacks."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        if retry:
            listed = list(commands)
            packed = conn.pack_commands(listed)  # type: ignore[no-untyped-call]
            return conn.retry.call_with_retry(
                lambda: exchange_packed(conn, [(packed, len(listed))]),
                lambda _error: conn.disconnect())  # type: ignore[no-untyped-call]
        return exchange_packed(conn, ((conn.pack_command(*args), 1)  # type: ignore[no-untyped-call]
                                      for args in commands))
    except BaseException:
        conn.disconnect()  # type: ignore[no-untyped-call]
        raise
    finally:
        pool.release(conn)


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
