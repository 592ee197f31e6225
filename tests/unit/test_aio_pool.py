"""gpuq.aio_pool.readable: the socket's own answer, before the event loop has read it."""

from __future__ import annotations

import asyncio
import socket
import time
from types import SimpleNamespace

from gpuq.aio_pool import readable


def test_a_close_the_loop_has_not_read_yet_is_seen_on_the_socket() -> None:
    async def scenario() -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        try:
            _, writer = await asyncio.open_connection(*listener.getsockname())
            peer, _ = listener.accept()
            conn = SimpleNamespace(_writer=writer)
            assert not readable(conn)  # open, nothing sent
            peer.sendall(b"+OK\r\n")
            time.sleep(0.05)  # blocking: the loop does not run, the bytes stay in the kernel
            assert readable(conn)
            await asyncio.sleep(0.05)  # the loop reads them into its buffer
            assert not readable(conn)
            peer.close()
            time.sleep(0.05)
            assert readable(conn)  # the end of the stream, unread by the loop
            writer.close()
        finally:
            listener.close()

    asyncio.run(scenario())


def test_a_connection_never_connected_is_not_readable() -> None:
    assert not readable(SimpleNamespace(_writer=None))
    assert not readable(SimpleNamespace())
