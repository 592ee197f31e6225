"""gpuq.views.top: frames rendered from hand-built views, and run_top against the suite's real Redis."""

from __future__ import annotations

import io
import json
import re
import time
from typing import Any

import pytest
import redis
from helpers import claim

from gpuq import Queue, worker_record
from gpuq.keys import Keys
from gpuq.views import top
from gpuq.views.inspect import PoolView, QueueView, WorkerView, recent_misses
from gpuq.views.top import render_top, run_top
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.presence import Presence

NOW = 1_700_000_000.0
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LONG_MODEL = "llama3-70b-instruct-awq-with-a-very-long-suffix"


def worker(wid: str, **over: Any) -> WorkerView:
    fields: dict[str, Any] = dict(id=wid, gpu="A100-80", vram_total_gb=80, vram_free_gb=40,
                                  models=["llama3-8b"], state="busy",
                                  running=["3f2a9c1d00aa", "77aa"], alive=True, levels="0123")
    return WorkerView(**{**fields, **over})


def pool(**extra: Any) -> PoolView:
    queues = [QueueView("P0", "llama3-8b", 12, 3.4), QueueView("P0", "mistral-7b", 3, 9.5),
              QueueView("P0", "whisper", 1, 0.3), QueueView("P0", "sdxl", 1, 0.2),
              QueueView("P2", LONG_MODEL, 340, 754.0)]
    workers = [worker("node12-h100-0-a3f9c2-with-a-long-tail", gpu="NVIDIA H100 80GB HBM3"),
               worker("w-idle", state="idle", running=[], models=[], levels="01"),
               worker("w-gone", alive=False, running=[])]
    fields: dict[str, Any] = dict(
        pool="prod", queues=queues, workers=workers, running=2, delayed=4, unschedulable=1,
        unschedulable_ids=["big"], largest_gpu_gb=75.0,
        stats={"sla_met:P0": 1203, "sla_missed:P0": 18, "sla_met:P1": 40, "sla_missed:P2": 3},
        reaper_active=True)
    return PoolView(**{**fields, **extra})


def miss(i: int, **over: Any) -> dict[str, Any]:
    return {"id": f"{i:08x}" + "0" * 24, "priority": "P0", "model": "llama3-8b",
            "wait_s": 2.5 + i, "at": NOW - 5 * i, "kind": "late", **over}


def lines_of(text: str, width: int) -> list[str]:
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    return lines


# -- render_top ----------------------------------------------------------------------------

def test_frame_fits_80_columns_and_shows_every_section() -> None:
    misses = [miss(i) for i in range(3, 12)] + [miss(0, kind="expired"), {"at": "soon"}]
    lines = lines_of(render_top(pool(), misses, width=80, now=NOW), 80)
    assert lines[0].startswith("gpuq top - pool prod - ")
    assert lines[1] == "tasks: 357 queued, 2 running, 4 delayed, 0 waiting, 0 parked, 1 unschedulable"
    assert lines[2] == "workers: 1 busy, 1 idle, 1 not responding; a reaper active"

    rows = {line.split()[0]: line for line in lines if re.match(r"P\d ", line)}
    assert list(rows) == ["P0", "P1", "P2", "P3"]
    # depth, oldest wait, attainment at handler start (floored), missed, the busiest models
    assert "SLA@START" in lines[4]
    assert rows["P0"].split()[1:5] == ["17", "9.5s", "98.5%", "18"]
    assert rows["P0"].split("  ")[-1].startswith("llama3-8b 12, mistral-7b 3")
    assert rows["P1"].split()[1:] == ["0", "-", "100.0%", "0", "-"]
    assert rows["P2"].split()[1:5] == ["340", "12m34s", "0.0%", "3"] and "~ 340" in rows["P2"]
    assert rows["P3"].split()[1:] == ["0", "-", "-", "-", "-"]

    start = lines.index("RECENT SLA MISSES (11)")
    shown = lines[start + 2:start + 2 + 8]
    assert shown[0].split() == ["0.0s", "P0", "llama3-8b", "2.5s", "expired", "00000000"]
    assert shown[1].split()[:2] == ["15.0s", "P0"]  # newest first, eight at most
    assert "WORKER" in lines[start + 2 + 8 + 1]

    workers = {line.split()[0]: line for line in lines if line.startswith(("node", "w-"))}
    assert list(workers) == ["node12~-tail", "w-gone", "w-idle"]  # by id; long ids keep both ends
    busy = workers["node12~-tail"]
    assert busy[13:23] == "H100 80G~ " and busy[23:39].split() == ["[###...]", "40/80"]
    assert busy[39:].split() == ["busy", "2", "3f2a9c", "P0123", "llama3-8b"]
    assert workers["w-gone"].split()[4] == "dead?"
    assert workers["w-idle"].split()[4:] == ["idle", "0", "-", "P01", "-"]


def test_frame_fits_narrow_and_uses_wide_terminals() -> None:
    misses = [miss(1, model=LONG_MODEL, priority="P1")]
    for width in (60, 61, 79, 100, 200):
        lines_of(render_top(pool(), misses, width=width, now=NOW), width)
    wide = render_top(pool(), misses, width=200, now=NOW)
    assert "llama3-8b 12, mistral-7b 3, whisper 1, +1" in wide
    assert "node12-h100-0~" in wide and "node12-h100-0-a3f9c2-with-a-long-tail" not in wide


def test_empty_pool() -> None:
    empty = PoolView(pool="p", queues=[], workers=[], running=0, delayed=0, unschedulable=0,
                     unschedulable_ids=[], largest_gpu_gb=0.0, stats={})
    lines = lines_of(render_top(empty, [], now=NOW), 80)
    assert lines[1:3] == ["tasks: 0 queued, 0 running, 0 delayed, 0 waiting, 0 parked, 0 unschedulable",
                          "workers: 0 busy, 0 idle; no reaper"]
    assert "(no workers)" in lines and not any("MISSES" in line for line in lines)
    assert not any(line.startswith(("reserved", "yielding", "scale")) for line in lines)


def test_reservations_yields_and_scale_one_line_each() -> None:
    view = pool(reservations=[{"worker": "w-idle", "task": "c0ffee1234"}],
                yield_requests=[{"task": "3f2a9c1d00aa", "worker": "w-1", "yield_by_s": 4.2,
                                 "for": "c0ffee1234"},
                                {"task": "77aa", "worker": "w-2", "yield_by_s": -2.0, "for": ""}],
                scale={"class:A100-80": {"current": 1, "desired": 3, "reason": "m +2"},
                       "model:m": {"current": 0, "desired": 1}, "unschedulable": {"tasks": 2},
                       "odd": {"raw": "x"}})
    lines = lines_of(render_top(view, [], now=NOW), 80)
    assert "reserved: w-idle for c0ffee12" in lines
    assert "yielding: 3f2a9c1d on w-1 (4s left), 77aa on w-2 (overdue 2s)" in lines
    assert "scale: class A100-80 1->3, model m 0->1, 2 unschedulable" in lines


def test_stale_scale_signals_say_so() -> None:
    """Regression: `gpuq top` showed the last reaper round's scale signals as current however
    old (`gpuq status` and the exporter already marked or left them out)."""
    scale = {"class:A100-80": {"current": 1, "desired": 3, "reason": "m +2", "at": 0}}
    assert "scale: class A100-80 1->3" in lines_of(render_top(pool(scale=scale, scale_age_s=2.0), [],
                                                              now=NOW), 80)
    lines = lines_of(render_top(pool(scale=scale, scale_age_s=300.4), [], now=NOW), 80)
    assert "scale (stale, 300s old): class A100-80 1->3" in lines


def test_formatting_helpers() -> None:
    assert top.shorten("node12-h100-0-a3f9c2", 11) == "node1~3f9c2"
    assert top.fit_list(["alpha", "beta", "gamma"], 3, 16) == "alpha, beta, +1"
    assert top.fit_list(["a-very-long-name"], 4, 10) == "a-ver~, +3"
    assert top.fit_list([], 0, 10) == ""
    assert [top.duration(s) for s in (0.25, 75, 7300, 200_000)] == ["0.2s", "1m15s", "2h01m",
                                                                   "2d07h"]
    assert top.bar(90, 80, 4) == "[####]" and top.bar(1, 0, 2) == "[..]"
    assert [top.number(v) for v in ("2.5", None, "x", True, float("nan"))] == [2.5, None, None,
                                                                                None, None]
    # regression: a generated id begins with its enqueue time, the same for hours of tasks
    assert top.short_id("01a23c5bed87000001a1b2c3d4e5f607") == "d4e5f607"
    assert top.short_id("01a23c5bed9c000002ffeeddccbbaa99", 6) == "bbaa99"
    assert top.short_id("rq-3f2a9c-1700000000000") == "rq-3f2a9"
    # a group of 8 x 141 GB kept the VRAM column's width (it was one character over)
    assert [top.size(v) for v in (0, 80.4, 999.4, 1128)] == ["0", "80", "999", "1.1T"]


def test_tenants_line_shows_gpus_against_the_cap_and_tasks_against_the_bound() -> None:
    tenants = [{"name": "a", "queued": {"P1": 4}, "max_gpus": 8, "bound": 3, "running": 2,
                "running_gpus": 6, "sla": {"P1": {"met": 3, "missed": 1}}},
               {"name": "b", "queued": {}, "max_gpus": None, "bound": None, "running": None,
                "running_gpus": None, "sla": {}},
               # found by a QA pass: a tenant capped by VRAM alone showed no use or cap here
               {"name": "c", "queued": {"P2": 1}, "max_gpus": None, "max_vram_gb": 10,
                "running_vram_gb": 8, "bound": None, "running": 2, "running_gpus": 2, "sla": {}}]
    v = PoolView(pool="p", queues=[], workers=[], running=0, delayed=0, unschedulable=0,
                 unschedulable_ids=[], largest_gpu_gb=0.0, stats={}, tenants=tenants)
    assert top._tenants(v) == ["", "tenants: a q4 6/8gpu 2/3b 75%, b q0, c q1 8/10GB"]


def test_names_with_control_characters_are_escaped_in_the_frame() -> None:
    worker = WorkerView("w-1", "A100\x1b[2J", 80, 40, ["m\x1b]0;x\x07"], "busy", [], True, levels="0")
    v = PoolView(pool="p", queues=[QueueView("P0", "m\x1b[31m", 3, 1.5)], workers=[worker], running=0,
                 delayed=0, unschedulable=0, unschedulable_ids=[], largest_gpu_gb=75.0, stats={})
    frame = render_top(v, [], width=120, now=0.0)
    assert "\x1b" not in frame and "\x07" not in frame and "m\\x1b[31m" in frame


# -- against Redis -------------------------------------------------------------------------

class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def seeded(real_queue: Queue) -> Queue:
    q = real_queue
    gpu = GpuInfo("A100-80", "uuid-w", 80, None, "declared")
    fields = worker_record.identity("w-a100", gpu, 5.0, 1, "0123", "h", 1)
    Presence(q.redis, q.keys, "w-a100").register(fields, 30_000)
    for priority, model in (("P0", "llama3-8b"), ("P0", "llama3-8b"), ("P2", "mistral-7b")):
        q.enqueue("sim.run", None, model=model, vram_gb=16, priority=priority)
    running = claim(q, "w-a100", 75)
    assert running is not None
    q.redis.hset(q.keys.stats, mapping={"sla_met:P0": 3, "sla_missed:P0": 1})
    for i in range(3):
        q.redis.lpush(q.keys.sla_misses, json.dumps(miss(i, at=NOW + i)))
    q.redis.lpush(q.keys.sla_misses, "not json", "[1, 2]")
    return q


def test_recent_misses_skips_what_does_not_parse(seeded: Queue) -> None:
    got = recent_misses(seeded.redis, seeded.keys)
    assert [m["at"] for m in got] == [NOW + 2, NOW + 1, NOW]
    assert recent_misses(seeded.redis, seeded.keys, limit=3) == got[:1]
    assert recent_misses(seeded.redis, seeded.keys, limit=0) == []


def test_once_prints_one_plain_frame(seeded: Queue) -> None:
    for once in (True, False):  # not a terminal: one frame either way
        out = io.StringIO()
        assert run_top(seeded.redis, seeded.keys, once=once, out=out, interval_s=0) == 0
        text = out.getvalue()
        assert "\x1b" not in text and text.count("gpuq top - pool") == 1
        lines = text.splitlines()
        assert "tasks: 2 queued, 1 running, 0 delayed, 0 waiting, 0 parked, 0 unschedulable" in lines
        rows = {line.split()[0]: line.split() for line in lines if re.match(r"P\d ", line)}
        assert rows["P0"][1] == "1" and rows["P0"][3:5] == ["75.0%", "1"]
        assert rows["P2"][1] == "1" and rows["P2"][-2:] == ["mistral-7b", "1"]
        (row,) = [line.split() for line in lines if line.startswith("w-a100")]
        assert row[1] == "A100-80" and row[4:7] == ["busy", "1", row[6]] and row[7] == "P0123"
        assert "RECENT SLA MISSES (3)" in lines


def test_terminal_redraws_in_place(seeded: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("LINES", "60")
    out = FakeTty()
    assert run_top(seeded.redis, seeded.keys, out=out, interval_s=0.01, iterations=2) == 0
    text = out.getvalue()
    assert text.startswith(top.HIDE_CURSOR + top.CLEAR) and text.endswith(top.SHOW_CURSOR)
    assert text.count(top.HOME) == 2 and text.count("gpuq top - pool") == 2
    assert all(len(line) <= 100 for line in ESCAPE.sub("", text).splitlines())


def test_short_terminal_cuts_the_frame(seeded: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", "10")
    out = FakeTty()
    assert run_top(seeded.redis, seeded.keys, out=out, iterations=1) == 0
    lines = ESCAPE.sub("", out.getvalue()).splitlines()
    assert len(lines) == 9 and re.fullmatch(r"\.\.\. \d+ more lines", lines[-1])


def test_ctrl_c_exits_cleanly(seeded: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt(_: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", interrupt)
    out = FakeTty()
    assert run_top(seeded.redis, seeded.keys, out=out) == 0
    assert out.getvalue().count("gpuq top - pool") == 1 and out.getvalue().endswith(top.SHOW_CURSOR)


def test_redis_errors_propagate() -> None:
    dead = redis.Redis.from_url("redis://127.0.0.1:1/0", decode_responses=True)
    with pytest.raises(redis.ConnectionError):
        run_top(dead, Keys("p"), once=True, out=io.StringIO())
    dead.close()


def test_handler_timeouts_show_as_status_shows_them() -> None:
    """`gpuq status` lists each handler's timeout_s (the worker hash's `timeouts`); top did not
    show them. As status words them: a bound alone where the live workers agree, each bound
    with its count of workers where they differ (a dead worker's not counted); wrapped to
    the width, on at most three lines, the last ending in "+N"."""
    bounds = [(True, {"gen": 30.0, "emb": 2.0}), (True, {"gen": 60.0, "emb": 2.0}), (True, {"emb": 2.0}),
              (False, {"gen": 5.0, "emb": 9.0, "old": 1.0})]
    workers = [worker(f"w-{i}", alive=alive, handlers=["gen", "emb"], timeouts=t)
               for i, (alive, t) in enumerate(bounds)]
    lines = lines_of(render_top(pool(workers=workers), [], 80, now=NOW), 80)
    at = lines.index("handler timeouts: emb 2s,")
    assert lines[at + 1] == " " * 18 + "gen 30s on 1 worker / 60s on 1 worker / none on 1 worker"
    assert lines[at - 1] == ""
    assert at < [i for i, line in enumerate(lines) if line.startswith("WORKER")][0]
    assert "old" not in "\n".join(lines)
    wide = lines_of(render_top(pool(workers=workers), [], 120, now=NOW), 120)
    assert "handler timeouts: emb 2s, gen 30s on 1 worker / 60s on 1 worker / none on 1 worker" in wide
    many = [worker("w", handlers=[f"handler-{i:02d}" for i in range(20)],
                   timeouts={f"handler-{i:02d}": 10.0 * (i + 1) for i in range(20)})]
    lines = lines_of(render_top(pool(workers=many), [], 80, now=NOW), 80)
    at = [i for i, x in enumerate(lines) if x.startswith("handler timeouts: handler-00 10s, ")][0]
    assert lines[at + 1].startswith(" " * 18 + "handler-") and lines[at + 2].endswith(", +11")
    assert lines[at + 3] == ""  # three lines at most
    assert not any(x.startswith("handler timeouts") for x in render_top(pool(), [], 80, now=NOW).splitlines())
