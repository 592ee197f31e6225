"""scripts/profile_lua.py at a small size: its lupa run of the library replies and writes
as redis-server does, and its report names the scripts' own lines. Speed is never asserted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def test_a_small_run_matches_redis_and_names_lines(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("lupa")
    sys.path.insert(0, str(SCRIPTS))
    try:
        import profile_lua

        assert profile_lua.main(["--tasks", "5", "--top", "5"]) == 0
    finally:
        sys.path.remove(str(SCRIPTS))
    out = capsys.readouterr().out
    assert "cross-check: 11 replies" in out, out
    for verb in ("claim", "enqueue", "ack", "ack_claim"):
        assert f"== {verb}:" in out, out
    assert "claim.lua:" in out and "lib/args.lua:" in out, out
