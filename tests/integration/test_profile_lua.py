"""scripts/profile_lua.py at a small size: its lupa run of the library replies and writes
as redis-server does, and its report names the scripts' own lines and counts every
redis.call by command. Speed is never asserted."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def profile(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    pytest.importorskip("lupa")
    sys.path.insert(0, str(SCRIPTS))
    try:
        import profile_lua

        assert profile_lua.main(["--tasks", "5", "--top", "5", *args]) == 0
    finally:
        sys.path.remove(str(SCRIPTS))
    return capsys.readouterr().out


def commands(out: str, verb: str) -> dict[str, float]:
    """The redis.calls a task of one script's block, by command."""
    line = out.split(f"== {verb}:", 1)[1].splitlines()[1]
    return {name: float(n) for name, n in re.findall(r"([A-Z]+) (\d+\.\d+)", line)}


def test_a_small_run_matches_redis_and_names_lines(capsys: pytest.CaptureFixture[str]) -> None:
    out = profile(capsys)
    assert "cross-check: 11 replies" in out, out
    for verb in ("claim", "enqueue", "ack", "ack_claim"):
        assert f"== {verb}:" in out, out
    assert "enqueue.lua body" in out and "lib/args.lua:" in out and "lib/names.lua:" in out, out


def test_calls_made_as_a_tail_call_are_counted(capsys: pytest.CaptureFixture[str]) -> None:
    # set_write and new_token end in `return redis.call(...)`: Lua 5.1 drops their frame
    out = profile(capsys)
    claim, ack = commands(out, "claim"), commands(out, "ack")
    assert claim.get("SADD", 0) > 0 and claim.get("INCR", 0) > 0, out
    assert ack.get("ZREM", 0) > 0 and ack.get("SREM", 0) > 0, out


def test_a_batch_handlers_run_matches_redis(capsys: pytest.CaptureFixture[str]) -> None:
    out = profile(capsys, "--batch", "4")
    assert "cross-check: 8 replies" in out, out  # 5 enqueues, 2 claims of 4 and 1, 1 empty
    assert commands(out, "claim").get("INCRBY", 0) > 0, out
