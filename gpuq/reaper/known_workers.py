"""The live workers a scale step plans from, their fields that do not change while a worker
runs (GPU, levels, handlers) read once per worker start: a round reads each worker's state.
``UntilRegistration`` keeps such fields for the other reaper steps (the preemption planner,
the tenants' room) until any worker registers."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, Generic, TypeVar

import redis

from gpuq.keys import Keys
from gpuq.worker_record import WorkerFields, WorkerRecord

# started_at: when the worker process registered; a worker started again under its id
# registers anew, so a record kept under the same started_at still holds
PLANNED = WorkerFields(("gpu_name", "vram_total_gb", "kv_reserve_gb", "gpus", "levels", "handlers",
                        "state", "started_at"))
STATE = WorkerFields(("state", "started_at"))


class KnownWorkers:
    """Each live worker's planned fields, kept from its first full read while its
    ``started_at`` stays: 2 fields a round instead of 7 of its hash's 22 (at 2,048 workers
    3.4 against 8.4 ms of server CPU a round, scripts/bench_scale.py's fleet)."""

    def __init__(self) -> None:
        self.kept: dict[str, tuple[str, WorkerRecord]] = {}  # id -> (started_at, record)

    def read(self, pipe: redis.client.Pipeline, keys: Keys, live: Sequence[str]) -> None:
        """Queue each live worker's read on the caller's pipeline: its state, or all."""
        for wid in live:
            (STATE if wid in self.kept else PLANNED).read(pipe, keys, wid)

    def records(self, client: redis.Redis, keys: Keys, live: Sequence[str],
                replies: Iterator[Any]) -> list[WorkerRecord | None]:
        """The live workers' records from their replies (None: the hash is gone, the worker
        being reaped); a worker started again since its record was kept is read in full
        now. Workers no longer live are forgotten."""
        out: list[WorkerRecord | None] = []
        again: list[int] = []
        for wid in live:
            got = next(replies)
            kept = self.kept.get(wid)
            if kept is None:
                out.append(self._keep(wid, got))
            elif all(v is None for v in got):
                out.append(None)
            elif got[1] == kept[0]:
                out.append(replace(kept[1], state=str(got[0] or "")))
            else:
                again.append(len(out))
                out.append(None)
        if again:
            pipe = client.pipeline(transaction=False)
            for i in again:
                PLANNED.read(pipe, keys, live[i])
            for i, got in zip(again, pipe.execute()):
                out[i] = self._keep(live[i], got)
        self.kept = {w: self.kept[w] for w in live if w in self.kept}
        return out

    def _keep(self, wid: str, got: Sequence[Any]) -> WorkerRecord | None:
        record = PLANNED.record(wid, got)
        started = got[-1]
        if record is not None and started:
            self.kept[wid] = (str(started), record)
        else:  # no start to tell a restart by: read in full next round too
            self.kept.pop(wid, None)
        return record


V = TypeVar("V")


class UntilRegistration(Generic[V]):
    """Values read from live workers' hashes that change only when a worker starts again:
    kept per worker until the pool's ``registrations`` count moves (one may have started
    again under its id, on another GPU or with another concurrency; registrations are rare),
    and forgotten once a worker is no longer live (an id that comes back may be another GPU)."""

    def __init__(self) -> None:
        self.kept: dict[str, V] = {}
        self._registrations: object = None  # the pool's count when ``kept`` was checked

    def unknown(self, live: Sequence[str], registrations: object) -> list[str]:
        """The live workers whose values the caller reads (and keeps): those not kept, every
        one after a registration."""
        if registrations != self._registrations:
            self.kept, self._registrations = {}, registrations
        self.kept = {w: self.kept[w] for w in live if w in self.kept}
        return [w for w in live if w not in self.kept]

    def clear(self) -> None:
        self.kept, self._registrations = {}, None
