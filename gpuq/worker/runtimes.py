"""Run times a worker measured, waiting for its heartbeat thread to send them to learn.lua.

The executor adds a run once its ack succeeded: the handler's time, from its start with its
model loaded to its return (monotonic). Each beat sends at most ``LEARN_MAX_RUNS`` of them
in one call, and the worker sends the rest when it stops, so no script of a task's path
writes ``runtimes``. A call that fails puts its runs back. The buffer is bounded: past
``capacity`` the oldest runs go, counted for the heartbeat's log line, so a worker whose
calls keep failing holds a fixed amount.
"""

from __future__ import annotations

import functools
import re
import threading
from collections import deque
from collections.abc import Sequence

import redis

from gpuq.scripts import LEARN_MAX_RUNS, Calls, Scripts

Run = tuple[str, str, float]  # handler, model, seconds
CAPACITY = 1024  # runs kept while they wait: four full calls
NAMES_KEPT = 4096  # (handler, model) pairs whose names were checked, kept at most
MAX_SECONDS = 1e10  # learn.lua's bound; beyond it enqueue would read the mean as malformed
_SPACE = re.compile(r"[ \t\n\v\f\r]")  # what Lua's %s matches: learn.lua refuses such names


@functools.lru_cache(maxsize=NAMES_KEPT)  # checked once per pair: a batch adds a run per task
def _learnable_names(handler: str, model: str) -> bool:
    return bool(handler) and bool(model) and not _SPACE.search(handler) and not _SPACE.search(model)


def learnable(handler: str, model: str, seconds: float) -> bool:
    """Whether learn.lua takes the run: non-empty names without whitespace, and seconds a
    number 0..1e10 (a NaN fails the comparison)."""
    return _learnable_names(handler, model) and 0.0 <= seconds <= MAX_SECONDS


class RunTimes:
    """A thread-safe bounded buffer of measured runs, oldest first."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._runs: deque[Run] = deque()
        self._lock = threading.Lock()
        self._dropped = 0

    def __len__(self) -> int:
        return len(self._runs)

    def add(self, handler: str, model: str, seconds: float) -> bool:
        """Keep one run; False, keeping nothing, for one learn.lua would refuse (which would
        make it refuse the whole call)."""
        if not learnable(handler, model, seconds):
            return False
        # a deque's append is atomic: the lock (an argument parse and two calls a task) only
        # to trim past the capacity; take and put_back only ever take from the left
        self._runs.append((handler, model, float(seconds)))
        if len(self._runs) > self.capacity:
            with self._lock:
                self._trim()
        return True

    def add_all(self, runs: list[Run]) -> None:
        """``add`` for each run, under one lock: a batch's, which share one run time (the
        batch's over its tasks) and so mostly one tuple, checked once."""
        kept: list[Run] = []
        last: Run | None = None
        keep: Run | None = None
        for run in runs:
            if run is not last:
                last, keep = run, (run[0], run[1], float(run[2])) if learnable(*run) else None
            if keep is not None:
                kept.append(keep)
        with self._lock:
            self._runs.extend(kept)
            if len(self._runs) > self.capacity:
                self._trim()

    def take(self, limit: int = LEARN_MAX_RUNS) -> list[Run]:
        """Remove and return the oldest runs, at most ``limit``."""
        with self._lock:
            return [self._runs.popleft() for _ in range(min(limit, len(self._runs)))]

    def put_back(self, runs: Sequence[Run]) -> None:
        """Runs a failed call took go back in front, in their order; past the capacity the
        oldest go."""
        with self._lock:
            self._runs.extendleft(reversed(runs))
            self._trim()

    def dropped(self) -> int:
        """How many runs were dropped since the last call (and reset the count)."""
        with self._lock:
            n, self._dropped = self._dropped, 0
            return n

    def _trim(self) -> None:
        while len(self._runs) > self.capacity:
            self._runs.popleft()
            self._dropped += 1

    def send(self, scripts: Scripts, calls: Calls, *, rounds: int | None = 1) -> int:
        """Send the oldest runs to learn.lua, one call per ``LEARN_MAX_RUNS``, for up to
        ``rounds`` calls (None: until the buffer is empty); returns the runs sent. A call
        that fails on the connection puts its runs back and raises; one the script refuses
        (INVALID: ``add`` checks what it checks, so never expected) loses them and raises."""
        if rounds is None:
            rounds = len(self) // LEARN_MAX_RUNS + 1
        sent = 0
        for _ in range(rounds):
            runs = self.take()
            if not runs:
                break
            try:
                scripts.run(calls.learn(runs))
            except redis.RedisError:
                self.put_back(runs)
                raise
            sent += len(runs)
        return sent
