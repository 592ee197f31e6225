"""The reaper's --on-scale command (gpuq.reaper.scale_hook.CommandHook), with real
subprocesses."""

from __future__ import annotations

import os
import shlex
import sys
import threading
import time
from pathlib import Path

import fakeredis
import pytest

from gpuq import Config, Queue
from gpuq.reaper import scale_hook
from gpuq.reaper.loop import Reaper
from gpuq.reaper.scale_hook import CommandHook
from gpuq.reaper.scale_plan import ScaleSignal


def command(code: str, *args: str) -> str:
    return shlex.join([sys.executable, "-c", code, *args])


APPEND = "import sys; open(sys.argv[1], 'a').write(' '.join(sys.argv[2:]) + chr(10))"


def test_only_the_latest_call_of_a_class_waits_to_run(tmp_path: Path) -> None:
    """Regression: every call queued behind a slow one, so the newest count reached the
    autoscaler one timeout per stale call later."""
    out, gate = tmp_path / "calls", tmp_path / "gate"
    slow = ("import os, sys, time\n"
            f"while not os.path.exists({str(gate)!r}): time.sleep(0.01)\n" + APPEND)
    hook = CommandHook(command(slow, str(out)))
    hook("A100", 1, 2)
    time.sleep(0.3)  # the first call runs (held at the gate)
    for desired in (3, 4, 5):
        hook("A100", 1, desired)
    hook("L4", 0, 1)
    gate.touch()
    hook.wait(20)
    assert out.read_text().splitlines() == ["A100 1 2", "A100 1 5", "L4 0 1"]


def test_a_hook_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    """Regression: the timeout killed only the direct child: a wrapper's own child ran on
    and could apply a stale count later."""
    pid_file = tmp_path / "child"
    wrapper = ("import subprocess, sys\n"
               "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
               f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
               "p.wait()\n")
    hook = CommandHook(command(wrapper), timeout_s=1.0)
    assert hook.run("A100", 1, 2) is False
    child = int(pid_file.read_text())
    for _ in range(100):  # reaped by init once killed
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, 9)
        pytest.fail("the hook's child outlived the timeout")


def test_a_failed_call_is_made_again_while_desired_stands(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a call that failed once (the autoscaler's API away) was never repeated
    while desired stayed the same: the autoscaler kept the old count."""
    monkeypatch.setattr(scale_hook, "HOOK_RETRY_S", 0.0)
    out, broken = tmp_path / "calls", tmp_path / "broken"
    broken.touch()
    flaky = (f"import os, sys\nif os.path.exists({str(broken)!r}): sys.exit(3)\n" + APPEND)
    hook = CommandHook(command(flaky, str(out)))
    hook("A100", 1, 4)
    hook.wait(10)
    assert not out.exists() and hook.due_again("A100")
    assert not hook.due_again("A100")  # one retry at a time: its own outcome counts next
    broken.unlink()
    hook("A100", 1, 4)
    hook.wait(10)
    assert out.read_text().splitlines() == ["A100 1 4"] and not hook.due_again("A100")


def test_a_reaper_active_again_after_a_standby_tells_the_hook_afresh() -> None:
    """Regression: it kept what it had told before its standby, and stayed silent while
    another reaper had told the autoscaler another count meanwhile."""
    client = fakeredis.FakeRedis(decode_responses=True)
    config = Config(pool="hk").validate()
    Queue(client, config)
    calls: list[tuple[str, int, int]] = []
    reaper = Reaper(client, config)
    reaper.scaler.hook = lambda cls, current, desired: calls.append((cls, current, desired))
    reaper.scaler.told["A100"] = 5
    reaper.active = False
    reaper.lead()
    assert reaper.active and reaper.scaler.told == {}


def test_calls_from_many_threads_each_run_or_coalesce(tmp_path: Path) -> None:
    out = tmp_path / "calls"
    hook = CommandHook(command(APPEND, str(out)))
    threads = [threading.Thread(target=hook, args=(f"c{i % 3}", 0, i)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hook.wait(20)
    lines = out.read_text().splitlines()
    assert {line.split()[0] for line in lines} == {"c0", "c1", "c2"}


def test_a_class_that_falls_short_of_its_desired_count_is_told_again() -> None:
    """Found by a QA pass: the only worker of a wanted class died (1 -> 1 became 0 -> 1) and
    the hook heard nothing, desired being unchanged: an autoscaler that sets its count from
    these calls replaced no one. Told again when the live count falls below desired."""
    client = fakeredis.FakeRedis(decode_responses=True)
    config = Config(pool="hs").validate()
    calls: list[tuple[str, int, int]] = []
    scaler = Reaper(client, config).scaler
    scaler.hook = lambda cls, current, desired: calls.append((cls, current, desired))
    for current, desired in ((0, 1), (1, 1), (1, 1), (0, 1), (0, 1), (1, 1)):
        scaler._tell(ScaleSignal("class", "2xA100", current, desired, "r"))
    assert calls == [("2xA100", 0, 1), ("2xA100", 0, 1)]
