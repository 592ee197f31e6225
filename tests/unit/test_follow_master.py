"""gpuq.failover without Sentinels that answer (the moves themselves: test_failover.py)."""

from __future__ import annotations

import time

from gpuq.connection import connect
from gpuq.embedded import free_port
from gpuq.failover import follow_master


def test_sentinels_that_do_not_answer_change_nothing_and_raise_nothing() -> None:
    """Called from a worker's main loop and each reaper round: Sentinels down while the
    master serves must not fail either."""
    client = connect(f"redis+sentinel://127.0.0.1:{free_port()}/m")
    try:
        pool = client.connection_pool
        pool.proxy.master_address = ("127.0.0.1", 1)  # as if connected once
        began = time.monotonic()
        assert follow_master(client) is False
        assert time.monotonic() - began < 5
        assert pool.master_address == ("127.0.0.1", 1)
        assert follow_master(connect("redis://127.0.0.1:1/0")) is False  # not a Sentinel client
    finally:
        client.close()
