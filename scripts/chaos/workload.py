"""The soak's tasks, drawn from its seed: mixed priorities, models, durations and kinds."""

from __future__ import annotations

import random
from typing import Any

from gpuq.task import new_task_id
from workers.chaos import MODELS, TIMEOUT_S

PRIORITIES = ((0, 0.10), (1, 0.20), (2, 0.40), (3, 0.30))
MODEL_SHARES = (("m-small", 0.40), ("m-mid", 0.30), ("m-large", 0.20), ("m-xl", 0.10))
# run: plain work; yield_once: resumes from its own checkpoint; fail_once: retried once;
# timeout_*: past chaos.timed's timeout_s (the first attempt, or every one); stubborn*: heed
# no stop or yield request, so the worker stops them by force (workers/chaos.py)
KINDS = (("run", 0.71), ("yield_once", 0.10), ("fail_once", 0.08), ("fail_always", 0.02),
         ("timeout_once", 0.03), ("timeout_always", 0.01), ("stubborn", 0.03),
         ("stubborn_swallow", 0.01), ("stubborn_async", 0.01))
TIMED = ("timeout_once", "timeout_always")
STUBBORN = ("stubborn", "stubborn_swallow", "stubborn_async")
HANDLERS = {"timeout_once": "chaos.timed", "timeout_always": "chaos.timed",
            "stubborn_swallow": "chaos.timed", "stubborn_async": "chaos.atimed"}
# the swallowing kinds, past their 0.5 s bound, are stopped 2 s (the grace) later: one still
# running stop_s (1 s) after that makes its worker exit
STUBBORN_S = (1.0, 5.0)
PRODUCERS = (("sync", 0.40), ("async", 0.30), ("bulk", 0.30))


def pick(rng: random.Random, shares: tuple[tuple[Any, float], ...]) -> Any:
    values, weights = zip(*shares)
    return rng.choices(values, weights)[0]


def duration(rng: random.Random) -> float:
    """Seconds of work: mostly short, some long enough to meet a kill or a stop."""
    r = rng.random()
    if r < 0.6:
        return round(rng.uniform(0.02, 0.2), 3)
    if r < 0.9:
        return round(rng.uniform(0.2, 1.0), 3)
    return round(rng.uniform(1.0, 3.0), 3)


def task(rng: random.Random) -> dict[str, Any]:
    model = pick(rng, MODEL_SHARES)
    kind = pick(rng, KINDS)
    if kind in TIMED:
        seconds = round(rng.uniform(2, 7) * TIMEOUT_S, 3)
    else:
        seconds = round(rng.uniform(*STUBBORN_S), 3) if kind in STUBBORN else duration(rng)
    out: dict[str, Any] = {
        "handler": HANDLERS.get(kind, "chaos.run"),
        "payload": {"kind": kind, "s": seconds},
        "model": model, "vram_gb": MODELS[model][0] + round(rng.uniform(0, 2), 1),
        "priority": pick(rng, PRIORITIES), "est_s": seconds, "max_attempts": 6,
        "task_id": new_task_id(),
    }
    if rng.random() < 0.15:  # some carry deadlines; the tight ones may expire under load
        # never under the task's own estimate, which enqueue refuses
        out["deadline_s"] = round(max(rng.uniform(2.0, 30.0), seconds) + 0.05, 1)
    return out


def tasks(n: int, seed: int) -> dict[str, list[dict[str, Any]]]:
    """n tasks split among the sync, async and bulk producers."""
    rng = random.Random(seed)
    out: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in PRODUCERS}
    for _ in range(n):
        out[pick(rng, PRODUCERS)].append(task(rng))
    return out
