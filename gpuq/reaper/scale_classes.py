"""GPU classes as the scale plan sees them: their shapes, and which one a model's shortfall
asks to grow.

A class is named by its workers' GPU name; its shape (usable GB per group, GPUs) is what a
worker registered for it, else what its first live worker shows. A shortfall goes to the
smallest class that holds the model's need, passing over a class whose live workers all
serve none of the model's queued priorities (lanes, ``--priorities P0,P1``): another worker
like them would take none of its work, so an autoscaler adding one would add it again at
every round while the backlog stays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuq.reaper.snapshot import Snapshot
from gpuq.shapes import smallest_fit

Shape = tuple[str, float, int]  # (class, usable GB, GPUs)


def sizes(snap: Snapshot) -> dict[str, float]:
    # a registered class's size, else the first live worker's of that class (reversed: it wins)
    return {**{w.gpu: w.usable_gb for w in reversed(snap.workers)}, **snap.classes}


def classes(snap: Snapshot) -> list[Shape]:
    """Each class's (name, usable GB, GPUs): registered, else as its first live worker shows."""
    gpus = {**{w.gpu: w.gpus for w in reversed(snap.workers)}, **snap.class_gpus}
    return [(c, gb, gpus.get(c, 1)) for c, gb in sizes(snap).items()]


def class_levels(snap: Snapshot) -> dict[str, set[int]]:
    """Per class with live workers, the priorities one of them serves."""
    out: dict[str, set[int]] = {}
    for w in snap.workers:
        out.setdefault(w.gpu, set()).update(p for p in range(4) if w.serves(p))
    return out


def fit(shapes: Sequence[Shape], need_gb: float, need_gpus: int, queued: Iterable[int],
        levels: Mapping[str, set[int]]) -> str | None:
    """The class a shortfall of work queued at priorities ``queued`` goes to: the smallest
    that holds the need among those whose live workers serve one of them (or that have
    none); the smallest that holds it when no such class does."""
    wanted = set(queued)
    serving = [c for c in shapes if c[0] not in levels or levels[c[0]] & wanted]
    return ((smallest_fit(serving, need_gb, need_gpus, levels) if wanted else None)
            or smallest_fit(shapes, need_gb, need_gpus, levels))
