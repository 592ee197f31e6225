"""What a worker's claim tells the claim script (``ClaimRequest``), and the call that says it.

A claim reports the worker's ledger (free and evictable VRAM, its models, those a task
uses), its free slots, whether it is its shape's lookout or knows it is not in `idle`, and
the models it skips. On a busy worker each claim says what the one before said, so the call
is made again only when one of these changed: building the request and its arguments was
about a tenth of a runner's own CPU per no-op task. A call is immutable (its arguments
are copied where joined with an ack: gpuq.joined), so the one kept is sent again as it is.
"""

from __future__ import annotations

from typing import Any

from gpuq.claims import Claim, ClaimRequest
from gpuq.scripts import Call, Calls
from gpuq.worker.broken import Broken
from gpuq.worker.models import ModelCache


class Asking:
    """The claim call of one worker, kept while what it says stays the same."""

    def __init__(self, worker_id: str, levels: str, gpus: int, batches: tuple[tuple[str, int], ...],
                 cache: ModelCache, broken: Broken, calls: Calls) -> None:
        self.worker_id = worker_id
        self.levels = levels
        self.gpus = gpus
        self.batches = batches
        self.cache = cache
        self.broken = broken
        self.calls = calls
        self._said: tuple[Any, ...] | None = None  # what the kept call says
        self._call: Call[Claim] | None = None

    def call(self, slots: int, lookout: bool, unlisted: bool) -> Call[Claim]:
        """The claim call for the worker as it is now (called with the cache lock held, as
        the claim is sent: the VRAM it reports is what the worker holds)."""
        said = (*self.cache.ledger(), slots, lookout, unlisted, self.broken.skipped())
        if self._call is None or said != self._said:
            free_gb, evictable_gb, loaded, in_use, loading = said[:5]
            req = ClaimRequest(self.worker_id, free_gb, evictable_gb, slots, loaded, self.levels, self.gpus,
                               in_use, self.batches, lookout, unlisted, said[8], loading)
            self._call, self._said = self.calls.claim(req), said
        return self._call
