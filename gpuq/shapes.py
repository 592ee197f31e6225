"""GPU shapes (usable VRAM, GPUs) and the ``need`` index's scores, as lua/lib/classes.lua
writes and reads them: a one-GPU task is scored by its VRAM need (GB), a task across g GPUs
by g x WIDE + its VRAM, so "which queued tasks can no shape hold" is a few score ranges of
one sorted set, and a score names the task's shape without reading its hash."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

WIDE = 2.0**40  # lua/lib/classes.lua NEED_WIDE
CAP = 2.0**39  # NEED_CAP: VRAM counts up to it in a score

Shape = tuple[float, int]  # (usable or needed GB, GPUs)


def gpus_of(value: object) -> int:
    """A stored GPU count (a task's or a class's field) as 1..64; what is no finite number
    counts as one GPU, as the scripts read it."""
    try:
        n = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 1
    return int(min(max(n, 1), 64)) if math.isfinite(n) else 1


def score(vram_gb: float, gpus: int = 1) -> float:
    return (gpus * WIDE if gpus > 1 else 0.0) + min(vram_gb, CAP)


def shape_of(need_score: float) -> Shape:
    """The (VRAM, GPUs) a ``need`` score stands for (VRAM to 1/64 GB for a wide task)."""
    gpus = int(need_score // WIDE)
    return (need_score - gpus * WIDE, gpus) if gpus >= 2 else (need_score, 1)


def largest_with(shapes: Sequence[Shape], gpus: int) -> float:
    """The most usable VRAM among the shapes with at least ``gpus`` GPUs (0: none has)."""
    return max((gb for gb, g in shapes if g >= gpus), default=0.0)


def holds(shapes: Sequence[Shape], vram_gb: float, gpus: int) -> bool:
    return vram_gb <= largest_with(shapes, gpus)


def unheld(shapes: Sequence[Shape]) -> list[tuple[str, str]]:
    """The ``need`` score ranges (ZRANGEBYSCORE min, max) of tasks no shape holds: as
    lua/lib/classes.lua's ``unheld``."""
    most = max((g for _, g in shapes), default=0)
    out = [(f"({largest_with(shapes, 1)!r}", f"({2 * WIDE!r}")]
    out += [(f"({g * WIDE + largest_with(shapes, g)!r}", f"({(g + 1) * WIDE!r}") for g in range(2, most + 1)]
    return [*out, (repr(max(2, most + 1) * WIDE), "+inf")]


def smallest_fit(classes: Sequence[tuple[str, float, int]], vram_gb: float, gpus: int,
                 live: Collection[str] = ()) -> str | None:
    """The class (name, usable GB, GPUs) with the least VRAM, then fewest GPUs, that holds a
    task of this shape, of equal shapes one in ``live`` first (a class registered once by a
    test worker, or renamed, must not win by its name); None when none does."""
    fits = [(gb, g, name not in live, name) for name, gb, g in classes if g >= gpus and gb >= vram_gb]
    return min(fits)[3] if fits else None
