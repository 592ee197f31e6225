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
    names = sorted(str(n) for n in client.smembers(keys.catalog))
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(keys.catalog_model(name))
    out = []
    for name, f in zip(names, pipe.execute()):
        loads = int(f.get("loads", 0))
        out.append(ModelEntry(name, float(f.get("vram_gb", 0)), loads,
                              float(f.get("total_load_s", 0)) / loads if loads else 0.0,
                              float(f.get("last_load_s", 0))))
    return out
