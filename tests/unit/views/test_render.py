"""gpuq.views.render.render_status over hand-built pool views (no Redis)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from gpuq.views.inspect import PoolView, QueueView, WorkerView
from gpuq.views.render import attainment, render_status


def view(**extra: Any) -> PoolView:
    worker = WorkerView("w-1", "A100-80", 80, 40, ["m"], "busy", ["t-run"], True, levels="0123")
    return PoolView(pool="p", queues=[QueueView("P0", "m", 3, 1.5)], workers=[worker], running=1,
                    **{"delayed": 0, "unschedulable": 0, "unschedulable_ids": [], "largest_gpu_gb": 75.0,
                       "stats": {}, **extra})


def test_plain_view_has_no_extra_sections() -> None:
    text = render_status(view())
    assert "P0123" in text and "LEVELS" in text
    for section in ("reservations:", "yield requests:", "scale signals:"):
        assert section not in text


def test_sla_attainment_at_handler_start_per_priority_with_counts() -> None:
    text = render_status(view(stats={"sla_met:P0": 1999, "sla_missed:P0": 1, "sla_missed:P2": 3}))
    assert ("within SLA at handler start: P0 99.9% (1999 met, 1 missed), "
            "P2 0.0% (0 met, 3 missed)") in text.splitlines()
    assert "within SLA" not in render_status(view())


def test_attainment_is_floored() -> None:
    assert [attainment(m, x) for m, x in ((0, 0), (1999, 1), (1, 0), (0, 4))] == [
        "-", "99.9%", "100.0%", "0.0%"]


def test_reservations_yields_and_scale_signals() -> None:
    text = render_status(view(
        reservations=[{"worker": "w-1", "task": "t-wait"}],
        yield_requests=[{"task": "t-run", "worker": "w-1", "yield_by_s": 4.25, "for": "t-wait"},
                        {"task": "t-old", "worker": "w-2", "yield_by_s": -2.0, "for": ""}],
        scale={"model:m": {"current": 1, "desired": 3, "reason": "backlog 3 tasks, 90 s of work"},
               "class:A100-80": {"current": 1, "desired": 3, "reason": "m +2"},
               "unschedulable": {"tasks": 2, "largest_gb": 200.0, "class_gb": 75.0},
               "odd": {"raw": "x"}}))
    lines = text.splitlines()
    assert "reservations:" in lines and "  w-1 held for t-wait" in lines
    assert "yield requests:" in lines
    assert "  t-run on w-1: yield within 4.2s for t-wait" in lines
    assert "  t-old on w-2: yield overdue by 2.0s for ?" in lines
    start = lines.index("scale signals:")
    signal_lines = lines[start + 1:]
    assert signal_lines[0].split() == ["class", "A100-80", "1", "->", "3", "m", "+2"]
    assert signal_lines[1].split()[:5] == ["model", "m", "1", "->", "3"]
    assert signal_lines[1].endswith("backlog 3 tasks, 90 s of work")
    assert signal_lines[2] == "  unschedulable: 2 task(s), the largest needs 200 GB"
    assert len(signal_lines) == 3


def test_tasks_no_live_worker_runs_are_named() -> None:
    text = render_status(view(unregistered={"nope.x": ["t-1", "t-2"]},
                              scale={"unregistered": {"nope.x": 2}}))
    lines = text.splitlines()
    assert "no live worker runs handler 'nope.x': 2 queued task(s) near the queue heads: t-1, t-2" in lines
    assert "  handlers no live worker runs (sampled tasks): nope.x (2)" in lines


def test_view_with_new_fields_stays_json() -> None:
    v = view(reservations=[{"worker": "w-1", "task": "t"}], scale={"class:x": {"current": 0}})
    data = json.loads(json.dumps(v.to_dict()))
    assert data["workers"][0]["levels"] == "0123"
    assert data["reservations"] == [{"worker": "w-1", "task": "t"}]
    assert data["yield_requests"] == [] and data["scale"] == {"class:x": {"current": 0}}


def test_tenants_show_gpus_against_the_cap_and_tasks_against_the_bound() -> None:
    sla = {"P1": {"met": 3, "missed": 1}}
    tenants = [
        {"name": "a", "registered": True, "weight": 2.0, "max_gpus": 8, "max_vram_gb": None,
         "bound": 3, "running": 2, "running_gpus": 6, "running_vram_gb": 120.0,
         "queued": {"P1": 4}, "sla": sla},
        {"name": "b", "registered": False, "weight": 1.0, "max_gpus": None, "max_vram_gb": None,
         "bound": None, "running": None, "running_gpus": None, "running_vram_gb": None,
         "queued": {}, "sla": {}}]
    lines = render_status(view(tenants=tenants)).splitlines()
    header = lines.index("tenants:") + 1
    assert lines[header].split()[:5] == ["TENANT", "WEIGHT", "GPUS/CAP", "VRAM/CAP", "TASKS/BOUND"]
    assert lines[header + 1].split() == ["a", "2", "6/8", "-", "2/3", "P1=4", "P1", "75.0%"]
    assert lines[header + 2].split() == ["b*", "1", "-", "-", "-", "-", "-"]
    assert lines[-1].startswith("bound: running tasks the reaper allows")


def test_names_with_control_characters_are_escaped() -> None:
    """A model may hold any character but whitespace, braces and commas: an escape sequence
    in its name must not reach the terminal."""
    worker = WorkerView("w-1", "A100\x1b[2J", 80, 40, ["m\x1b]0;x\x07"], "busy", [], True, levels="0")
    v = PoolView(pool="p", queues=[QueueView("P0", "m\x1b[31m", 3, 1.5)], workers=[worker], running=0,
                 delayed=0, unschedulable=0, unschedulable_ids=[], largest_gpu_gb=75.0, stats={})
    text = render_status(v)
    assert "\x1b" not in text and "\x07" not in text
    assert "m\\x1b[31m" in text and "A100\\x1b[2J" in text


def test_unschedulable_tasks_are_set_against_each_class_shape() -> None:
    """Found by a QA pass: "needs 100 GB" beside "the largest: 136 GB usable" read as if the
    task fit; its two GPUs, and the 38 GB the only two-GPU class offers, went unsaid."""
    text = render_status(view(unschedulable=2, unschedulable_ids=["t1", "t2"], largest_gpu_gb=136.0,
                              class_shapes=[(38.0, 2), (136.0, 1)],
                              scale={"unschedulable": {"tasks": 2, "largest_gb": 100.0, "largest_gpus": 2,
                                                       "class_gb": 136.0}}))
    assert ("unschedulable: 2 queued task(s) need more VRAM or GPUs than any registered GPU class "
            "holds (usable: 38 GB on 2 GPUs, 136 GB on 1 GPU): t1, t2") in text.splitlines()
    assert "  unschedulable: 2 task(s), the largest needs 100 GB on 2 GPUs" in text.splitlines()


def test_scale_signals_no_reaper_rewrote_say_how_old_they_are() -> None:
    """Regression: with no reaper running, `gpuq status` showed the last reaper's scale
    signals (e.g. "1 -> 10") as if current, however old."""
    scale = {"class:L4": {"current": 1, "desired": 10, "reason": "m +9", "at": 0}}
    lines = render_status(view(scale=scale, scale_age_s=300.4)).splitlines()
    assert "scale signals (stale: from a reaper round 300s ago):" in lines
    assert "scale signals:" in render_status(view(scale=scale, scale_age_s=1.0)).splitlines()


def test_a_slow_reapers_signals_are_stale_only_after_three_of_its_rounds() -> None:
    """Regression: staleness was a fixed 15 s, so a reaper run with `reap_interval_s` 30 had
    its signals called stale between every two rounds (and the exporter dropped them)."""
    scale = {"class:L4": {"current": 1, "desired": 2, "reason": "m +1", "at": 0, "every_s": 30.0}}
    assert "scale signals:" in render_status(view(scale=scale, scale_age_s=60.0)).splitlines()
    lines = render_status(view(scale=scale, scale_age_s=91.0)).splitlines()
    assert "scale signals (stale: from a reaper round 91s ago):" in lines


def test_handler_timeouts_show_where_live_workers_disagree() -> None:
    workers = [WorkerView(f"w-{i}", "L4", 24, 20, [], "idle", [], alive, handlers=["gen", "emb"],
                          timeouts=bounds)
               for i, (alive, bounds) in enumerate([(True, {"gen": 30.0, "emb": 2.0}),
                                                    (True, {"gen": 60.0, "emb": 2.0}),
                                                    (True, {"emb": 2.0}),
                                                    (False, {"gen": 5.0, "emb": 9.0, "old": 1.0})])]
    lines = render_status(dataclasses.replace(view(), workers=workers)).splitlines()
    at = lines.index("handler timeouts (timeout_s; past it a call fails its task, retryable):")
    assert lines[at + 1:at + 3] == ["  emb" + " " * 37 + "2s",  # a dead worker's bounds not counted
                                    "  gen" + " " * 37 + "30s on 1 worker, 60s on 1 worker, none on 1 worker"]
    assert "old" not in "\n".join(lines)
    assert "handler timeouts" not in render_status(view())
