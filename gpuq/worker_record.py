"""The worker record: the hash a worker keeps about itself (``keys.worker(id)``).

Its schema lives here: the fields a worker writes (``identity``, ``status_fields``; the
writes themselves are ``gpuq.worker.presence``'s alone) and how VRAM a task may use is
derived from them (``usable_gb``). docs/PROTOCOL.md tables the fields.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuq.worker.gpu import GpuInfo

Fields = dict[Any, Any]  # hash fields; redis-py types mapping keys invariantly


def identity(worker_id: str, gpu: GpuInfo, reserve_gb: float, concurrency: int, levels: str,
             host: str, pid: int, handover: tuple[int, int, int] | None = None,
             handlers: Iterable[str] = ()) -> Fields:
    """The worker hash fields that do not change while it runs (rewritten by every
    heartbeat, so a worker the reaper took for dead shows whole again). handover: the defer
    bound (ms), fair_every and lease (ms) with which enqueue starts a task on this worker
    while it idles with one slot, blocked on its wake list; None: it takes no hand-overs.
    handlers: the handler names its app runs (shown, so tasks no live worker can run are
    flagged by status and the scale signals)."""
    defer_ms, fair_every, lease_ms = handover if handover else ("", "", "")
    return {"id": worker_id, "host": host, "pid": pid, "gpu_name": gpu.name,
            "gpu_uuid": gpu.uuid, "gpu_index": "" if gpu.index is None else gpu.index,
            "gpu_source": gpu.source, "vram_total_gb": gpu.total_gb, "kv_reserve_gb": reserve_gb,
            "concurrency": concurrency, "levels": levels,
            "handover_defer_ms": defer_ms, "fair_every": fair_every, "lease_ms": lease_ms,
            "handlers": ",".join(sorted(handlers)), "started_at": int(time.time() * 1000)}


def usable_gb(total_gb: object, reserve_gb: object) -> float:
    """What tasks may use of a GPU: its total less the KV-cache reserve (the claim script
    computes the same from the same two fields)."""
    return float(total_gb) - float(reserve_gb or 0)  # type: ignore[arg-type]


def status_fields(free_gb: float, running: int, models: list[str], state: str,
                  nvml_used_gb: float | None) -> Fields:
    fields: Fields = {"vram_free_gb": round(free_gb, 3), "running": running,
                      "models": ",".join(models), "state": state}
    if nvml_used_gb is not None:
        fields["nvml_used_gb"] = nvml_used_gb
    return fields
