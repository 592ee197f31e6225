"""The live workers a scale step plans from, their fields that do not change while a worker
runs (GPU, levels, handlers) read once per worker start: a round reads each worker's state.
``UntilRegistration`` keeps such fields for the other reaper steps (the preemption planner,
the tenants' room) until any worker registers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
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


# known workers whose lease did not move whose state a round reads anyway, those read longest
# ago first: what is written without a beat (retire.lua's `retiring`, a beat's hash written
# after this round read its lease) is seen within live/REFRESH rounds
REFRESH = 256


class KnownWorkers:
    """Each live worker's planned fields, kept from its first full read while its
    ``started_at`` stays: 2 fields a round instead of 7 of its hash's 22 (at 2,048 workers
    3.4 against 8.4 ms of server CPU a round, scripts/bench_scale.py's fleet). Given the
    workers' leases, a worker's state is read only when its lease moved since its last read
    (a beat writes its state: heartbeat.lua renews the lease, the hash's rewrite follows;
    a registration writes both at once) and for REFRESH others a round, read longest ago
    first; the others keep their last state."""

    def __init__(self, refresh: int = REFRESH) -> None:
        self.kept: dict[str, tuple[str, WorkerRecord]] = {}  # id -> (started_at, record)
        self.refresh = refresh
        self.leases: dict[str, float] = {}  # id -> its lease when its state was last read
        self.when: dict[str, int] = {}  # id -> the read (a count) its state was last read at
        self.reads = 0
        self.reading: set[str] = set()  # the workers this read asks about

    def read(self, pipe: redis.client.Pipeline, keys: Keys, live: Sequence[str],
             leases: Mapping[str, float] | None = None) -> None:
        """Queue on the caller's pipeline the reads of the live workers this round asks
        about: all of a worker not kept, the state of the others (leases given: of those
        whose lease moved, and REFRESH more)."""
        self.reads += 1
        if leases is None:
            self.reading = set(live)
        else:
            still = [w for w in live if w in self.kept and self.leases.get(w) == leases.get(w)]
            still.sort(key=lambda w: (self.when.get(w, 0), w))
            self.reading = set(live) - set(still[self.refresh:])
            self.leases.update((w, leases[w]) for w in self.reading if w in leases)
        for wid in live:
            if wid in self.reading:
                (STATE if wid in self.kept else PLANNED).read(pipe, keys, wid)
                self.when[wid] = self.reads

    def records(self, client: redis.Redis, keys: Keys, live: Sequence[str],
                replies: Iterator[Any]) -> list[WorkerRecord | None]:
        """The live workers' records from the replies of those ``read`` asked about (None:
        the hash is gone, the worker being reaped), the others as kept; a worker started
        again since its record was kept is read in full now. Workers no longer live are
        forgotten."""
        out: list[WorkerRecord | None] = []
        again: list[int] = []
        for wid in live:
            kept = self.kept.get(wid)
            if wid not in self.reading and kept is not None:
                out.append(kept[1])
                continue
            got = next(replies)
            if kept is None:
                out.append(self._keep(wid, got))
            elif all(v is None for v in got):  # read in full again while it stays live
                del self.kept[wid]
                out.append(None)
            elif got[1] == kept[0]:
                record = replace(kept[1], state=str(got[0] or ""))
                self.kept[wid] = (kept[0], record)
                out.append(record)
            else:
                again.append(len(out))
                out.append(None)
        if again:
            pipe = client.pipeline(transaction=False)
            for i in again:
                PLANNED.read(pipe, keys, live[i])
            for i, got in zip(again, pipe.execute()):
                out[i] = self._keep(live[i], got)
        alive = set(live)
        self.kept = {w: self.kept[w] for w in live if w in self.kept}
        self.leases = {w: t for w, t in self.leases.items() if w in alive}
        self.when = {w: n for w, n in self.when.items() if w in alive}
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
