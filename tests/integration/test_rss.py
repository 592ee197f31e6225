"""A long-lived worker stays flat: scripts/rss_soak.py at a size that fits the suite.

The full soak (100,000 tasks, RSS at 10,000 against 100,000) runs by hand:
``python scripts/rss_soak.py``. Here 20,000 tasks compare RSS at 2,000 and 20,000 (about
10 s), and a handler that keeps 2 KB of every task shows that the soak does catch a leak.
This module is also that handler's app (``--app test_rss:leaky``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuq.app import App, Context

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SOAK = ROOT / "scripts" / "rss_soak.py"

leaky = App("leaky")
kept: list[bytes] = []


@leaky.any_model()
def load(name: str) -> str:
    return name


@leaky.handler("sim.run")
def run(model: str, payload: Any, ctx: Context) -> str:
    kept.append(ctx.task_id.encode() * 64)  # 2 KB per task, never freed
    return ctx.task_id


def soak(tasks: int, *args: str) -> tuple[int, dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    out = subprocess.run([sys.executable, str(SOAK), "--tasks", str(tasks), "--json", *args], env=env,
                         capture_output=True, text=True, timeout=100, check=False)
    assert out.stdout, out.stderr
    report: dict[str, Any] = json.loads(out.stdout)
    return out.returncode, report


def test_a_long_lived_worker_stays_flat() -> None:
    code, report = soak(20_000)
    samples = report["samples"]
    assert samples[-1]["tasks"] == 20_000
    base = next(s for s in samples if s["tasks"] == report["base_tasks"])
    assert 2000 <= base["tasks"] < 2600  # read soon after the 2,000th task
    assert report["ratio"] == pytest.approx(samples[-1]["rss_mb"] / base["rss_mb"], abs=1e-3)
    assert report["ratio"] <= 1.1 and report["ok"] and code == 0, report


def test_the_soak_catches_a_leaking_worker() -> None:
    code, report = soak(10_000, "--app", "test_rss:leaky")
    assert report["app"] == "test_rss:leaky"
    assert report["ratio"] > 1.1 and not report["ok"] and code == 1, report
