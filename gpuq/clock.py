"""The pool's clock: the Redis server's, which every script reads with TIME.

Liveness scores, reservation expiries, start-by scores and task timestamps are written by
the scripts on the server's clock, so whatever compares a time with them (the reaper's
planners, ``gpuq status`` and ``gpuq top``) reads "now" from the same clock: a host whose
own clock is off by more than a lease would otherwise see every worker dead, or none.
Timers that only measure time on this host (sleeps, deadlines of a loop) stay monotonic.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis


def from_time_reply(reply: Sequence[int | str]) -> int:
    """Milliseconds since the epoch from a TIME reply (seconds, microseconds): for a TIME
    sent in a pipeline with other reads."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


def server_ms(client: redis.Redis) -> int:
    """The server's time in milliseconds since the epoch (one round trip)."""
    return from_time_reply(client.time())
