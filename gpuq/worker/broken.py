"""Models whose load failed on this worker: its claims pass over their queues for a backoff.

A loader that raised (weights missing on this host's disk, a driver fault on this GPU) most
likely fails the same way for the next task of that model here, while other workers may load
it. After a failed load of a model the worker names it in its claims as one to skip (claim.lua
leaves its queues to the other workers, and offers pass the worker over for it: lib/lanes.lua)
for ``load_backoff_s`` (gpuq.config, 30 s), doubled at each failure in a row up to
``load_backoff_max_s`` (10 min); a successful load forgets the failures. Past the backoff (an
idle worker wakes then) the next claim takes the model's tasks again and tries the load once
more. A preload hint (gpuq.worker.control) skips the model as claims do.

The task whose load failed is passed on, its attempt given back (``gpuq.worker.passing``),
when the failure is the first in a row and another live worker runs its handler; a later
failure spends the attempt, so a model no worker can load still ends its tasks failed.
docs/DECISIONS.md, "A model whose load failed is left to other workers".
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from gpuq.errors import ModelLoadFailed
from gpuq.worker.passing import Elsewhere


def skipped(model: str) -> str:
    """The error of a task passed on, unloaded, while its model is skipped on this worker."""
    return f"model {model} is skipped on this worker: its load failed there lately"


class Broken:
    """Each model's failed loads in a row and until when this worker's claims skip it."""

    def __init__(self, elsewhere: Elsewhere, backoff_s: float, max_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.elsewhere = elsewhere  # who else runs a handler
        self.backoff_s = backoff_s  # a model's first skip (a load costs tens of seconds)
        self.max_s = max_s  # the longest, however many failures in a row
        self._clock = clock
        self._failed: dict[str, tuple[int, float]] = {}  # model -> (failures in a row, skip until)
        self._lock = threading.Lock()

    def failed(self, model: str) -> tuple[int, float]:
        """A load of ``model`` failed: its failures in a row, and the seconds it is skipped."""
        with self._lock:
            count = self._failed.get(model, (0, 0.0))[0] + 1
            wait = min(self.max_s, self.backoff_s * 2 ** min(count - 1, 64))  # 2**1024: no float
            self._failed[model] = (count, self._clock() + wait)
        return count, wait

    def loaded(self, model: str) -> int:
        """A load of ``model`` succeeded: its failures are forgotten; returns how many there were."""
        if model not in self._failed:  # the common case: no lock
            return 0
        with self._lock:
            return self._failed.pop(model, (0, 0.0))[0]

    def failures(self, model: str) -> int:
        """The failed loads of ``model`` in a row (0: none, or a load succeeded since)."""
        with self._lock:
            return self._failed.get(model, (0, 0.0))[0]

    def skipping(self, model: str) -> bool:
        """Whether ``model`` is within its backoff now (asked for every cold start)."""
        if not self._failed:
            return False
        with self._lock:
            kept = self._failed.get(model)
        return kept is not None and kept[1] > self._clock()

    def skipped(self) -> list[tuple[str, int]]:
        """The models claims skip now, each with the ms its skip lasts (the claim lists it in
        `lanes` that long, so that offers pass this worker over for it: lib/lanes.lua); every
        claim asks, and almost always none failed."""
        if not self._failed:
            return []
        now = self._clock()
        with self._lock:
            return sorted((m, math.ceil((until - now) * 1000))
                          for m, (_, until) in self._failed.items() if until > now)

    def ends_in(self) -> float:
        """Seconds until the nearest skip ends (inf: none): an idle worker looks at that model's
        queued tasks again then, rather than at its next wake-up."""
        if not self._failed:
            return math.inf
        now = self._clock()
        with self._lock:
            return min((until - now for _, until in self._failed.values() if until > now), default=math.inf)

    def skips(self, fields: dict[str, str]) -> bool:
        """Whether a task that reached this worker although its claims skip its model (a
        hand-over, a reservation) goes to another worker that runs its handler, unloaded;
        with none, the load is tried (only this worker could run the task)."""
        return (self.skipping(fields["model"])
                and self.elsewhere.runs_task(fields))

    def passes(self, exc: BaseException, fields: dict[str, str]) -> bool:
        """Whether a task whose model failed to load here is passed on, its attempt given
        back: at the first failure in a row (a later one spends it, so a model no worker
        loads still ends its tasks failed) while another live worker runs its handler."""
        return (isinstance(exc, ModelLoadFailed) and self.failures(exc.model) <= 1
                and self.elsewhere.runs_task(fields))
