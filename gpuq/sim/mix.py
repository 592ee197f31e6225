"""Trace mixes: a trace's requests with a share of its models made 70B-class, too large for one
GPU, so a replay weighs multi-GPU groups (``gpuq simulate --mix-70b SHARE``).

A 70B model in 16-bit weights is 140 GB; with a few GB of working memory a request of it
needs 144 GB over two GPUs (two 80 GB cards keep 150 GB after a 5 GB KV reserve each). Which
models become 70B is drawn once per seed (the same in every policy's replay); their requests
keep their arrival, priority and run time. A 70B load reads twice the bytes of the measured
base-model loads, spread over its two GPUs: its load takes the measured time times
``LOAD_SCALE``.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import TYPE_CHECKING

from gpuq.errors import ConfigError
from gpuq.sim.model import TraceTask

if TYPE_CHECKING:
    from gpuq.sim.traces import LoadTimes

VRAM_GB = 144.0  # 140 GB of weights and 4 GB of working memory
GPUS = 2
LOAD_SCALE = 2.0


def with_70b(tasks: list[TraceTask], loads: LoadTimes, share: float,
             seed: int) -> tuple[list[TraceTask], list[str]]:
    """The tasks with ``share`` (0..1) of the models made 70B (their loads scaled in
    ``loads``), and those models' names."""
    if not 0 <= share <= 1:
        raise ConfigError(f"--mix-70b must be a share in 0..1, got {share:g}")
    models = sorted({t.model for t in tasks})
    large = sorted(random.Random(f"70b:{seed}").sample(models, round(share * len(models))))
    chosen = set(large)
    for model in large:
        loads.scales[model] = LOAD_SCALE * loads.scale(model)
    return [replace(t, vram_gb=VRAM_GB, gpus=GPUS) if t.model in chosen else t
            for t in tasks], large
