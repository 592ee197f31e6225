"""Waiting out a Redis that went away: capped exponential backoff, said once.

A worker's runners and heartbeat, and a reaper, keep running while Redis is down or
restarting. Each loop retries with its own ``Backoff`` (0.1 s doubling to a cap), and all the
loops of one process share one ``Outage`` (a worker's is its ``outage``), which logs
``redis.unavailable`` when the first of them fails and ``redis.recovered`` when one succeeds
again, instead of a line per loop per retry (a worker with four runners would otherwise log
several lines a second).
"""

from __future__ import annotations

import logging
import random
import threading
import time

FIRST_S = 0.1
CAP_S = 5.0


class Backoff:
    """One loop's retry delays: ``first`` doubling up to ``cap``, jittered down by up to a
    fifth so many processes that lost the same server do not all come back in step."""

    def __init__(self, first: float = FIRST_S, cap: float = CAP_S) -> None:
        self.first = first
        self.cap = cap
        self._next = first

    def delay(self) -> float:
        """The next wait (seconds), and the one after it doubled."""
        current = self._next
        self._next = min(self.cap, current * 2)
        return current * random.uniform(0.8, 1.0)

    def reset(self) -> None:
        self._next = self.first

    def pause_until(self, until: float) -> bool:
        """Sleep the next delay, cut short at ``until`` (monotonic); False, without sleeping,
        when no time is left: the caller gives up."""
        wait = min(self.delay(), until - time.monotonic())
        if wait <= 0:
            return False
        time.sleep(wait)
        return True


class Outage:
    """Whether Redis is down for one process (``who``, e.g. ``worker=w1``), shared by its loops.

    ``down`` logs once per outage; ``up`` logs the recovery once, and only for a call that
    started after the outage began: a reply to a command sent before the server went away
    says nothing about whether it is back."""

    def __init__(self, who: str, log: logging.Logger, cap: float = CAP_S) -> None:
        self.who = who
        self.log = log
        self.cap = cap
        self.since: float | None = None  # monotonic time the outage was first seen
        self.outages = 0
        self._lock = threading.Lock()

    def down(self, exc: BaseException) -> None:
        with self._lock:
            if self.since is not None:
                return
            self.since = time.monotonic()
            self.outages += 1
        cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self.log.warning("redis.unavailable %s error=%s: retrying with backoff up to %g s",
                         self.who, cause, self.cap)

    def up(self, started: float) -> None:
        """A call begun at ``started`` (monotonic) succeeded."""
        if self.since is None:  # the common case: no lock taken
            return
        with self._lock:
            if self.since is None or started < self.since:
                return
            seconds = time.monotonic() - self.since
            self.since = None
        self.log.warning("redis.recovered %s after %.1f s", self.who, seconds)

