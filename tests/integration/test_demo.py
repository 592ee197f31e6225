"""``gpuq demo`` end to end: an embedded server, five real worker processes and a reaper."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_runs_and_reports_every_priority() -> None:
    # no GPUQ_REDIS_URL: the demo must start (and stop) its own embedded server
    env = {k: v for k, v in os.environ.items() if k not in ("GPUQ_REDIS_URL", "GPUQ_POOL")}
    proc = subprocess.run([sys.executable, "-m", "gpuq", "demo", "--seconds", "4"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "embedded" in proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.strip()}
    for label in ("P0", "P1", "P2", "P3"):
        assert label in rows, proc.stdout
    assert rows["P3"][-2:] == ["-", "-"]  # P3 has no SLA (and no deadlines in the mix)
    assert "not ended: 0" in proc.stdout
    # the two-GPU group runs the 70B requests of the mix (seed 1 draws two in 4 s)
    assert rows["sim-2xA100-80GB"][1] == "2x80GB"
    assert "multi-GPU tasks: 2, run on sim-2xA100-80GB" in proc.stdout
