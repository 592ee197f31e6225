"""scripts/bench_sched.py's targets table: each target judged on what its run really shows."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_sched.py"


def bench_sched() -> Any:
    spec = importlib.util.spec_from_file_location("bench_sched_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def report(tasks: int, wall_s: float) -> dict[str, Any]:
    level = {"sla_attainment": 1.0, "cold_starts": 0, "tasks": tasks // 4}
    return {"priorities": {p: dict(level) for p in ("P0", "P1", "P2", "P3")}, "tasks": tasks,
            "wall_s": wall_s, "starved": 0, "model_loads": 1,
            "reference": {"loads": 1, "cold_starts": {"P0": 1}},
            "vs_reference": {"model_loads": 1.0, "cold_starts_p0": 1.0}}


def test_a_limited_replay_does_not_meet_the_full_traces_speed_target() -> None:
    """Found by a QA pass: `bench_sched.py --limit 500` printed the 15,000-request target as
    met (1 s for 500 requests)."""
    targets = bench_sched().targets

    def speed(tasks: int, wall_s: float) -> bool:
        run = report(tasks, wall_s)
        (met,) = [ok for name, _, ok in targets(run, run, run, run) if name.startswith("15,000")]
        return bool(met)

    assert not speed(500, 1.0)
    assert speed(15_615, 57.0) and not speed(15_615, 61.0)
