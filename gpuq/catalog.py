"""The pool's model catalog: each model's VRAM footprint and its measured load times.

An entry lives ``TTL_MS`` (30 days) after the model was last loaded or held: each load and
each heartbeat of a worker holding it renew it, and the reaper's pass takes the names of
expired entries out of the set. A pool that mints model names keeps those in use, not
every name it ever loaded; a model back after a month is loaded as a new one (its mean
load time is learned again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from gpuq.keys import Keys
from gpuq.worker_record import field_number


@dataclass(frozen=True)
class ModelEntry:
    name: str
    vram_gb: float
    loads: int
    mean_load_s: float
    last_load_s: float
    gpus: int = 1  # the GPUs the task whose claim last loaded it asked (a preload: unchanged)


TTL_MS = 30 * 86_400_000


def record_load(pipe: redis.client.Pipeline, keys: Keys, model: str, vram_gb: float,
                seconds: float, gpus: int = 0) -> None:
    """gpus: the GPUs the task the load was for asked (0: a preload, left as it was), so the
    reaper's forecast hints never preload a model whose tasks span a group onto fewer GPUs."""
    key = keys.catalog_model(model)
    pipe.sadd(keys.catalog, model)
    pipe.hset(key, mapping={"vram_gb": vram_gb, "last_load_s": round(seconds, 4)})
    if gpus > 0:
        pipe.hset(key, "gpus", gpus)
    pipe.hincrby(key, "loads", 1)
    pipe.hincrbyfloat(key, "total_load_s", round(seconds, 4))
    pipe.pexpire(key, TTL_MS)


def renewals(keys: Keys, models: list[str]) -> list[tuple[Any, ...]]:
    """The commands a heartbeat sends for the models its worker holds."""
    return [("PEXPIRE", keys.catalog_model(m), TTL_MS) for m in models]


def read(client: redis.Redis, keys: Keys) -> list[ModelEntry]:
    """Every entry, by name (an expired one the reaper has not taken out yet left out)."""
    names = sorted(str(n) for n in client.smembers(keys.catalog))
    return [entry(name, f) for name, f in zip(names, read_entries(client, keys, names)) if f]


def read_entries(client: redis.Redis, keys: Keys, names: list[str]) -> list[dict[str, str]]:
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(keys.catalog_model(name))
    return pipe.execute()


def entry(name: str, f: dict[str, str]) -> ModelEntry:
    """An entry as read; a field that is not a finite number (written by hand or by a foreign
    writer) reads as 0, so one bad entry breaks neither status, the exporter nor the reaper."""
    loads = int(field_number(f.get("loads")))
    return ModelEntry(name, field_number(f.get("vram_gb")), loads,
                      field_number(f.get("total_load_s")) / loads if loads > 0 else 0.0,
                      field_number(f.get("last_load_s")), _gpus(f.get("gpus")))


def _gpus(text: str | None) -> int:
    try:
        return min(64, max(1, int(text or 1)))
    except ValueError:  # written by hand: one GPU
        return 1


PAGE = 512  # entries a reaper round reads (CatalogPages)


class CatalogPages:
    """The catalog as the reaper reads it round after round: a page of entries (SSCAN) a
    round, the others as last read, so a round's reads stay bounded however many models the
    pool has loaded (a hash each). A catalog of up to a page is read whole every round; a
    larger one in full every size/page rounds (20 at 10,000 models), and an entry left out
    of the catalog is forgotten at the end of the pass that no longer finds it."""

    def __init__(self, page: int = PAGE) -> None:
        self.page = page
        self.cursor = 0
        self.entries: dict[str, ModelEntry] = {}
        self.passed: set[str] = set()  # names this pass found so far

    def read(self, client: redis.Redis, keys: Keys) -> list[ModelEntry]:
        """Every entry known, by name, after reading the next page."""
        cursor, got = client.sscan(keys.catalog, self.cursor, count=self.page)
        names = sorted({str(n) for n in got})
        expired = []
        for name, f in zip(names, read_entries(client, keys, names)):
            if f:
                self.entries[name] = entry(name, f)
            else:  # unused for TTL_MS: its name leaves the set too
                expired.append(name)
        if expired:
            client.srem(keys.catalog, *expired)
        self.passed.update(set(names) - set(expired))
        self.cursor = int(cursor)
        if self.cursor == 0:
            self.entries = {n: e for n, e in self.entries.items() if n in self.passed}
            self.passed = set()
        return [self.entries[n] for n in sorted(self.entries)]
