"""asyncio connection pools that check a connection's socket before handing it out.

The sync pool drops a connection the server closed (a restart, a server timeout, ``CLIENT
KILL``) when it hands it out, since its check reads the socket (gpuq.wire). The asyncio
pool's check reads only what the event loop has already taken from the socket: when the
loop has not run since the server closed it, the end of the stream is still in the kernel,
the connection passes, and the call sent on it fails with ``ConnectionFailed``. These pools
first ask the socket itself (a poll with no wait) and drop a connection with anything to
read, to reconnect on its send, as the sync pool does: an idle connection has nothing to
read but the server's close, or data left unread by a call that broke off.
"""

from __future__ import annotations

import select
from typing import Any

import redis.asyncio as aredis
import redis.asyncio.sentinel


def readable(connection: Any) -> bool:
    """Whether the connection's socket has something to read (or was closed) that the event
    loop has not read yet; False for one not connected."""
    transport = getattr(getattr(connection, "_writer", None), "transport", None)
    if transport is None or transport.is_closing():
        return False
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        fd = sock.fileno()
        if hasattr(select, "poll"):  # no limit on the descriptor's number, unlike select
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(0))
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return True  # a socket that cannot be asked is not worth keeping


class _Checked:
    """Mixed in before a pool class: its ``ensure_connection`` (run on each hand-out) drops a
    connection whose socket has something unread first."""

    async def ensure_connection(self, connection: Any) -> None:
        if readable(connection):
            await connection.disconnect()
        await super().ensure_connection(connection)  # type: ignore[misc]


class CheckedPool(_Checked, aredis.ConnectionPool):
    pass


class CheckedSentinelPool(_Checked, redis.asyncio.sentinel.SentinelConnectionPool):
    pass


def client_from_url(url: str, **kwargs: Any) -> aredis.Redis:
    """``redis.asyncio.Redis.from_url`` on a CheckedPool; the client closes its pool."""
    client = aredis.Redis(connection_pool=CheckedPool.from_url(url, **kwargs))
    client.auto_close_connection_pool = True
    return client
