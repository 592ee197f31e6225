"""scripts/bench_functions.py at its smallest size prints its three rows (FCALL against
EVALSHA, on a server of its own). Speed is never asserted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def test_the_smallest_run_prints_its_three_rows(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench_functions

        assert bench_functions.main(["--rounds", "2", "--n", "20"]) == 0
    finally:
        sys.path.remove(str(SCRIPTS))
    rows = [line for line in capsys.readouterr().out.splitlines() if "FCALL/EVALSHA" in line]
    assert len(rows) == 3, rows
    for row in rows:
        evalsha, fcall = (float(row.split(name)[1].split()[0]) for name in ("EVALSHA", "FCALL "))
        assert evalsha > 0 and fcall > 0
