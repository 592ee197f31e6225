"""The pool's model catalog: each model's VRAM footprint and its measured load times."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from gpuq.keys import Keys


@dataclass(frozen=True)
class ModelEntry:
    name: str
    vram_gb: float
    loads: int
    mean_load_s: float
    last_load_s: float


def record_load(pipe: redis.client.Pipeline, keys: Keys, model: str, vram_gb: float,
                seconds: float) -> None:
    key = keys.catalog_model(model)
    pipe.sadd(keys.catalog, model)
    pipe.hset(key, mapping={"vram_gb": vram_gb, "last_load_s": round(seconds, 4)})
    pipe.hincrby(key, "loads", 1)
    pipe.hincrbyfloat(key, "total_load_s", round(seconds, 4))


def read(client: redis.Redis, keys: Keys) -> list[ModelEntry]:
    """Every entry, by name."""
    names = sorted(str(n) for n in client.smembers(keys.catalog))
    return [entry(name, f) for name, f in zip(names, read_entries(client, keys, names))]


def read_entries(client: redis.Redis, keys: Keys, names: list[str]) -> list[dict[str, str]]:
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(keys.catalog_model(name))
    return pipe.execute()


def entry(name: str, f: dict[str, str]) -> ModelEntry:
    loads = int(f.get("loads", 0))
    return ModelEntry(name, float(f.get("vram_gb", 0)), loads,
                      float(f.get("total_load_s", 0)) / loads if loads else 0.0,
                      float(f.get("last_load_s", 0)))


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
        for name, f in zip(names, read_entries(client, keys, names)):
            self.entries[name] = entry(name, f)
        self.passed.update(names)
        self.cursor = int(cursor)
        if self.cursor == 0:
            self.entries = {n: e for n, e in self.entries.items() if n in self.passed}
            self.passed = set()
        return [self.entries[n] for n in sorted(self.entries)]
