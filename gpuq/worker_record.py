"""The worker record: the hash a worker keeps about itself (``keys.worker(id)``).

Its schema lives here: the fields a worker writes (``identity``, ``status_fields``; the
writes themselves are ``gpuq.worker.presence``'s alone), how VRAM a task may use is
derived from them (``usable_gb``), and how readers parse them (``WorkerRecord``, read
through ``WorkerFields``). docs/PROTOCOL.md tables the fields.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis

    from gpuq.app import HandlerSpec
    from gpuq.keys import Keys
    from gpuq.worker.gpu import GpuInfo

Fields = dict[Any, Any]  # hash fields; redis-py types mapping keys invariantly


def identity(worker_id: str, gpu: GpuInfo, reserve_gb: float, concurrency: int, levels: str,
             host: str, pid: int, handover: tuple[int, int, int] | None = None,
             handlers: Mapping[str, HandlerSpec] | Iterable[str] = (), heartbeat_s: float = 0.0) -> Fields:
    """The worker hash fields that do not change while it runs (rewritten by every
    heartbeat, so a worker the reaper took for dead shows whole again). handover: the defer
    bound (ms), fair_every and lease (ms) with which enqueue starts a task on this worker
    while it idles with one slot, blocked on its wake list; None: it takes no hand-overs.
    handlers: the handler names its app runs (shown, so tasks no live worker can run are
    flagged by status and the scale signals), or its app's handlers (``App.handlers``),
    whose ``timeout_s`` bounds status shows too. reserve_gb: the KV-cache reserve of each
    device; the hash holds the group's (VRAM fields span every device of a group).
    heartbeat_s: its beat's period, by which readers tell a silent worker (0: not said)."""
    defer_ms, fair_every, lease_ms = handover if handover else ("", "", "")
    specs = handlers.values() if isinstance(handlers, Mapping) else ()
    # "name=seconds": a name holds no comma, and seconds no "=" (read split at the last)
    timeouts = ",".join(sorted(f"{s.name}={s.timeout_s:g}" for s in specs if s.timeout_s is not None))
    return {"id": worker_id, "host": host, "pid": pid, "gpu_name": gpu.name,
            "gpu_uuid": gpu.uuid, "gpu_index": gpu.index_text, "gpus": gpu.count,
            "gpu_source": gpu.source, "vram_total_gb": gpu.total_gb,
            "kv_reserve_gb": gpu.reserve_gb(reserve_gb),
            "concurrency": concurrency, "levels": levels,
            "handover_defer_ms": defer_ms, "fair_every": fair_every, "lease_ms": lease_ms,
            "handlers": ",".join(sorted(handlers)), "timeouts": timeouts,
            "heartbeat_ms": int(heartbeat_s * 1000) or "", "started_at": int(time.time() * 1000)}


AWAY = ("draining", "retiring")  # worker states (WorkerRecord.state) that take no new work


def usable_gb(total_gb: object, reserve_gb: object) -> float:
    """What tasks may use of a GPU: its total less the KV-cache reserve (the claim script
    computes the same from the same two fields)."""
    return float(total_gb) - float(reserve_gb or 0)  # type: ignore[arg-type]


def lane(levels: str, skipped: Sequence[tuple[str, int]] = (), now_ms: int = 0) -> str:
    """A worker's `lanes` entry, as its claim writes it (lib/lanes.lua): the levels it serves,
    then each model its claims skip (gpuq.worker.broken: name, ms left) with the skip's end."""
    return levels + "".join(f" {model} {now_ms + left}" for model, left in skipped)


def lane_skips(entry: object, now_ms: int) -> dict[str, int]:
    """The models a `lanes` entry lists as skipped at now_ms, each with its skip's end (epoch
    ms); an end passed is stale and left out, as lib/lanes.lua reads it."""
    words = entry.split()[1:] if isinstance(entry, str) else []
    ends = ((m, int(end)) for m, end in zip(words[::2], words[1::2]) if end.isdigit())
    return {m: end for m, end in ends if end > now_ms}


def model_fields(free_gb: float, models: list[str]) -> Fields:
    """The fields a model load or eviction rewrites: what the worker holds and has free."""
    return {"vram_free_gb": round(free_gb, 3), "models": ",".join(models)}


def status_fields(free_gb: float, running: int, models: list[str], state: str,
                  nvml_used_gb: float | None) -> Fields:
    fields: Fields = {**model_fields(free_gb, models), "running": running, "state": state}
    if nvml_used_gb is not None:
        fields["nvml_used_gb"] = nvml_used_gb
    return fields


ALL_LEVELS = "0123"  # a worker that names no priorities serves them all
SILENT_BEATS = 3  # beat periods without a beat after which readers call a live worker silent


@dataclass(frozen=True)
class WorkerRecord:
    """A worker hash as readers see it. Every field has one default and one bound, so a
    hash a person damaged by hand (a field missing, a number that is not one) reads as a
    worker with less capacity rather than crashing ``gpuq status`` or the reaper."""

    id: str
    gpu_name: str = "?"
    vram_total_gb: float = 0.0
    kv_reserve_gb: float = 0.0
    vram_free_gb: float = 0.0  # as of the last heartbeat
    models: tuple[str, ...] = ()  # held, as of the last heartbeat
    state: str = ""  # as of the last heartbeat: idle, busy, draining, retiring
    levels: str = ALL_LEVELS  # priorities served, e.g. "01" for a lane
    handlers: tuple[str, ...] = ()  # what its app runs
    concurrency: int = 1
    gpus: int = 1  # devices in its group
    timeouts: tuple[tuple[str, float], ...] = ()  # (handler, timeout_s) of its bounded handlers
    seen_at: float = 0.0  # its last beat, server epoch ms
    heartbeat_ms: float = 0.0  # its beat's period (0: not said)

    @property
    def usable_gb(self) -> float:
        return usable_gb(self.vram_total_gb, self.kv_reserve_gb)

    @classmethod
    def parse(cls, worker_id: str, fields: Mapping[str, Any]) -> WorkerRecord | None:
        """The record from the hash's fields (all or some; absent ones are None or left
        out); None when no field is there: the hash is gone (the worker is being reaped)."""
        if all(v is None for v in fields.values()):
            return None
        levels = "".join(c for c in str(fields.get("levels") or "") if c in ALL_LEVELS)
        return cls(id=worker_id, gpu_name=str(fields.get("gpu_name") or "?"),
                   vram_total_gb=field_number(fields.get("vram_total_gb")),
                   kv_reserve_gb=field_number(fields.get("kv_reserve_gb")),
                   vram_free_gb=field_number(fields.get("vram_free_gb")),
                   models=_names(fields.get("models")), state=str(fields.get("state") or ""),
                   levels=levels or ALL_LEVELS, handlers=_names(fields.get("handlers")),
                   concurrency=max(1, int(field_number(fields.get("concurrency")))),
                   gpus=max(1, int(field_number(fields.get("gpus")))),
                   timeouts=_timeouts(fields.get("timeouts")), seen_at=field_number(fields.get("seen_at")),
                   heartbeat_ms=field_number(fields.get("heartbeat_ms")))

    def silent(self, now_ms: float) -> bool:
        """Whether it missed SILENT_BEATS beats: killed, or its interpreter held (a handler
        in native code keeping the GIL), though its liveness has not lapsed yet."""
        return self.heartbeat_ms > 0 and now_ms - self.seen_at > SILENT_BEATS * self.heartbeat_ms


@dataclass(frozen=True)
class WorkerFields:
    """The fields of worker hashes one reader needs, read with HMGET on the reader's own
    pipeline (alongside its other reads: no round trip of its own) and parsed into records."""

    names: tuple[str, ...]

    def read(self, pipe: redis.client.Pipeline, keys: Keys, worker_id: str) -> None:
        pipe.hmget(keys.worker(worker_id), self.names)

    def record(self, worker_id: str, reply: Sequence[Any]) -> WorkerRecord | None:
        return WorkerRecord.parse(worker_id, dict(zip(self.names, reply)))


def field_number(value: object) -> float:
    """A non-negative finite number from a hash field (a worker's, a task's), else 0."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) and number > 0 else 0.0


def _names(value: object) -> tuple[str, ...]:
    return tuple(n for n in str(value or "").split(",") if n)


def _timeouts(value: object) -> tuple[tuple[str, float], ...]:
    """The (handler, seconds) pairs of a ``timeouts`` field; a damaged pair is left out."""
    pairs = (item.rpartition("=") for item in _names(value))
    return tuple((name, seconds) for name, _, text in pairs
                 if name and (seconds := field_number(text)) > 0)
