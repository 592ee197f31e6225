"""gpuq.reaper.scale.plan: the scale rules over hand-built snapshots (no Redis)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pytest

from gpuq.config import Config
from gpuq.reaper.scale_plan import HINT_EVERY_MS, ScalePlan, ScaleSignal, WarmHint, plan
from gpuq.reaper.snapshot import Backlog, Snapshot, WorkerState

NOW = 1_700_000_000_000
CLASSES = {"L4": 19.0, "A100": 75.0, "H200": 136.0}
BOUNDS = (19.0, 75.0, 136.0, math.inf)


def queue(model: str, depth: int, *, priority: int = 2, est_s: float = 1.0, vram_gb: float = 16.0,
          late: bool = False) -> Backlog:
    head = NOW - 1 if late else NOW + 60_000
    return Backlog(priority, model, depth, head, ((vram_gb, est_s, 1),) * min(depth, 50))


def worker(wid: str, gpu: str = "A100", *, idle_gb: float | None = None, levels: str = "0123",
           reserved: bool = False, skips: frozenset[str] = frozenset()) -> WorkerState:
    return WorkerState(wid, gpu, CLASSES[gpu], levels, idle_gb, reserved, skips=skips)


def bands(**counts: int) -> tuple[tuple[float, int], ...]:
    """need_bands over BOUNDS; counts by name: l4, a100, h200, over."""
    names = ("l4", "a100", "h200", "over")
    return tuple((b, counts.get(n, 0)) for b, n in zip(BOUNDS, names))


def snap(workers: Sequence[WorkerState] = (), backlogs: Sequence[Backlog] = (),
         holders: dict[str, set[str]] | None = None, **extra: object) -> Snapshot:
    return Snapshot(tuple(workers), tuple(backlogs), CLASSES,
                    {m: frozenset(ws) for m, ws in (holders or {}).items()}, **extra)  # type: ignore[arg-type]


def signal(result: ScalePlan, kind: str, name: str) -> ScaleSignal:
    (s,) = [s for s in result.signals if (s.kind, s.name) == (kind, name)]
    return s


def counts(result: ScalePlan, kind: str = "class") -> dict[str, tuple[int, int]]:
    return {s.name: (s.current, s.desired) for s in result.signals if s.kind == kind}


CFG = Config(min_workers=0)


def test_nothing_registered_plans_nothing() -> None:
    assert plan(Snapshot(), Config(), NOW) == ScalePlan([], [], 0, 0.0, 0.0)


def test_idle_pool_keeps_its_workers_and_min_workers_goes_to_the_largest_class() -> None:
    idle = [worker("a", "L4", idle_gb=19), worker("b", "L4", idle_gb=19)]
    assert counts(plan(snap(idle), CFG, NOW)) == {"L4": (2, 2), "A100": (0, 0), "H200": (0, 0)}
    empty = plan(snap(), Config(min_workers=2), NOW)
    assert counts(empty) == {"L4": (0, 0), "A100": (0, 0), "H200": (0, 2)}
    assert signal(empty, "class", "H200").reason == "min_workers 2"
    # with live workers, the minimum's difference goes to the class with the most of them
    topped = plan(snap([worker("a", "L4"), worker("b", "L4"), worker("c")]), Config(min_workers=5), NOW)
    assert counts(topped)["L4"] == (2, 4)


def test_backlog_asks_for_workers_that_drain_it_within_the_target() -> None:
    s = snap([worker("h")], [queue("m", 120, est_s=2.0)], {"m": {"h"}})
    result = plan(s, CFG, NOW)  # 240 s of work, 60 s target: 4 workers, one holds it
    model = signal(result, "model", "m")
    assert (model.current, model.desired) == (1, 4)
    assert model.reason == "backlog 120 tasks, 240 s of work"
    assert counts(result)["L4"] == (0, 3)  # the smallest class that fits 16 GB
    assert signal(result, "class", "L4").reason.startswith("m +3: backlog 120 tasks")


def test_load_time_counts_against_new_workers() -> None:
    s = snap([worker("h")], [queue("m", 120, est_s=2.0)], {"m": {"h"}}, load_s={"m": 20.0})
    # the holder drains 60 s; each new worker 60 - 20 = 40 s: 180 / 40 -> 5 more
    assert signal(plan(s, CFG, NOW), "model", "m").desired == 6
    slow = snap([], [queue("m", 10, est_s=30.0)], load_s={"m": 500.0})
    # a load slower than the target counts half of it: 300 s / 30 s
    assert signal(plan(slow, CFG, NOW), "model", "m").desired == 10


def test_idle_workers_that_fit_take_the_shortfall_first() -> None:
    workers = [worker("h"), worker("i1", "L4", idle_gb=19), worker("i2", "A100", idle_gb=70),
               worker("small", "L4", idle_gb=8), worker("lane", "L4", idle_gb=19, levels="0")]
    s = snap(workers, [queue("m", 120, est_s=2.0)], {"m": {"h"}})
    result = plan(s, CFG, NOW)
    # shortfall 3: i1 and i2 fit and serve P2; "small" is too full, "lane" serves P0 only
    assert counts(result) == {"L4": (3, 4), "A100": (2, 2), "H200": (0, 0)}


def test_an_idle_worker_covers_one_model_only() -> None:
    s = snap([worker("i", "L4", idle_gb=19)], [queue("a", 60), queue("b", 60)])
    assert counts(plan(s, CFG, NOW))["L4"] == (1, 2)


def test_late_head_with_no_idle_fit_asks_for_one_more() -> None:
    busy = snap([worker("h")], [queue("m", 1, priority=0, est_s=0.1, late=True)], {"m": {"h"}})
    model = signal(plan(busy, CFG, NOW), "model", "m")
    assert (model.current, model.desired) == (1, 2)
    assert model.reason == "P0 past SLA, no idle fit; backlog 1 tasks, 0 s of work"
    covered = snap([worker("h"), worker("i", "L4", idle_gb=19)], busy.backlogs, {"m": {"h"}})
    assert signal(plan(covered, CFG, NOW), "model", "m").desired == 1
    # an idle worker that does not serve P0 does not count
    lane = snap([worker("h"), worker("i", "L4", idle_gb=19, levels="23")], busy.backlogs, {"m": {"h"}})
    assert signal(plan(lane, CFG, NOW), "model", "m").desired == 2


def test_desired_is_capped_by_the_backlog_and_never_below_current() -> None:
    long = plan(snap([], [queue("m", 2, est_s=10_000)]), CFG, NOW)
    assert signal(long, "model", "m").desired == 2  # one worker per task at most
    held = snap([worker(f"h{i}") for i in range(3)], [queue("m", 1, est_s=0.1)],
                {"m": {"h0", "h1", "h2"}})
    assert (signal(plan(held, CFG, NOW), "model", "m").desired) == 3
    assert counts(plan(held, CFG, NOW))["A100"] == (3, 3)


def test_holders_that_are_not_live_do_not_count() -> None:
    s = snap([], [queue("m", 1)], {"m": {"gone"}})
    assert signal(plan(s, CFG, NOW), "model", "m").current == 0


def test_tasks_too_big_for_live_workers_raise_the_smallest_fitting_class() -> None:
    s = snap([worker("a", "L4"), worker("b", "L4")], [queue("big", 3, vram_gb=40, est_s=1)],
             need_bands=bands(a100=3))
    result = plan(s, CFG, NOW)
    assert counts(result) == {"L4": (2, 2), "A100": (0, 1), "H200": (0, 0)}
    assert "3 tasks fit no live worker" in signal(result, "class", "A100").reason
    # counted from the need index even when the sampled heads are small
    s = snap([worker("a", "L4")], [queue("mixed", 3, vram_gb=8, est_s=1)], need_bands=bands(h200=1))
    assert counts(plan(s, CFG, NOW))["H200"] == (0, 1)


def test_tasks_larger_than_every_class_are_unschedulable_not_scaled() -> None:
    s = snap([worker("a", "H200")], [queue("huge", 2, vram_gb=300)], need_bands=bands(over=2),
             largest_need_gb=300.0)
    result = plan(s, CFG, NOW)
    assert (result.unschedulable, result.largest_need_gb, result.largest_class_gb) == (2, 300.0, 136.0)
    assert counts(result) == {"L4": (0, 0), "A100": (0, 0), "H200": (1, 1)}
    assert counts(result, "model") == {}  # no worker could ever serve it: no model signal
    # an unschedulable task at a queue head does not steer the model's need
    mixed = Backlog(2, "m", 20, NOW + 1, ((300.0, 1.0, 1), (40.0, 1.0, 1)))
    assert counts(plan(snap([], [mixed]), CFG, NOW))["A100"] == (0, 1)


def test_warm_hint_goes_to_the_tightest_idle_worker_that_serves_the_backlog() -> None:
    workers = [worker("h"), worker("big", "H200", idle_gb=130), worker("tight", "L4", idle_gb=18),
               worker("full", "L4", idle_gb=8), worker("p3", "L4", idle_gb=17, levels="3")]
    s = snap(workers, [queue("m", 5, priority=1)], {"m": {"h"}}, footprint_gb={"m": 14.0})
    assert plan(s, Config(), NOW).hints == [WarmHint("tight", "m", 14.0)]
    assert WarmHint("tight", "m", 14.0).message == "preload m 14"
    assert WarmHint("w", "m", 12.25).message == "preload m 12.25"


def test_no_warm_hint_when_small_recent_or_a_holder_is_free() -> None:
    idle = worker("i", "L4", idle_gb=19)
    small = snap([worker("h"), idle], [queue("m", 3)], {"m": {"h"}})
    assert plan(small, Config(), NOW).hints == []
    s = snap([worker("h"), idle], [queue("m", 4)], {"m": {"h"}})
    assert plan(s, Config(), NOW).hints == [WarmHint("i", "m", 16.0)]  # the need, no footprint known
    assert plan(s, Config(), NOW, {"m": NOW - HINT_EVERY_MS + 1}).hints == []
    assert plan(s, Config(), NOW, {"m": NOW - HINT_EVERY_MS}).hints != []
    free_holder = snap([worker("h", idle_gb=50), idle], [queue("m", 9)], {"m": {"h"}})
    assert plan(free_holder, Config(), NOW).hints == []


def test_each_worker_is_hinted_once_per_step_and_reserved_ones_never() -> None:
    backlogs = [queue("a", 9), queue("b", 8)]
    one = snap([worker("i", "L4", idle_gb=19)], backlogs)
    assert [h.model for h in plan(one, Config(), NOW).hints] == ["a"]  # the bigger backlog first
    two = snap([worker("i", "L4", idle_gb=19), worker("j", "L4", idle_gb=19)], backlogs)
    assert {(h.worker, h.model) for h in plan(two, Config(), NOW).hints} == {("i", "a"), ("j", "b")}
    held = snap([worker("i", "L4", idle_gb=19, reserved=True)], backlogs)
    assert plan(held, Config(), NOW).hints == []


def test_late_models_come_first() -> None:
    s = snap([worker("i", "L4", idle_gb=19)], [queue("bulk", 100), queue("urgent", 4, priority=0, late=True)])
    result = plan(s, Config(), NOW)
    assert [h.model for h in result.hints] == ["urgent"]
    assert [s.name for s in result.signals if s.kind == "model"] == ["urgent", "bulk"]


@pytest.mark.parametrize("target", [0.0, 0.001])
def test_a_zero_target_asks_for_one_worker_per_task(target: float) -> None:
    s = snap([], [queue("m", 7, est_s=1)])
    assert signal(plan(s, Config(scale_target_s=target, min_workers=0), NOW), "model", "m").desired == 7


def test_a_queue_that_emptied_since_the_index_was_read_is_ignored() -> None:
    result = plan(snap([], [Backlog(0, "m", 0, math.inf)]), CFG, NOW)
    assert [s for s in result.signals if s.kind == "model"] == []


def test_a_lane_holding_the_model_is_no_capacity_for_work_it_does_not_serve() -> None:
    """Regression: a P0/P1 lane holding the model counted as a worker draining its P3
    backlog: nothing was asked for until the tasks were a day late."""
    s = snap([worker("lane", levels="01", idle_gb=60)], [queue("m", 2, priority=3, est_s=30.0)],
             {"m": {"lane"}})
    result = plan(s, CFG, NOW)
    assert (signal(result, "model", "m").current, signal(result, "model", "m").desired) == (0, 1)
    assert counts(result)["L4"] == (0, 1)
    online = snap([worker("lane", levels="01")], [queue("m", 2, priority=0, est_s=30.0)],
                  {"m": {"lane"}})
    assert signal(plan(online, CFG, NOW), "model", "m").current == 1


def test_an_idle_worker_skipping_a_model_neither_covers_its_work_nor_takes_its_hint() -> None:
    """Regression: the scale plan counted an idle worker whose claims skip a model (its load
    failed there lately) as one that would take the model's work: late work got no worker
    more, the shortfall was met by it, and its warm hint went to it, which passed it over."""
    skipper = worker("s", "L4", idle_gb=19, skips=frozenset({"m"}))
    late = snap([worker("h"), skipper], [queue("m", 1, priority=0, est_s=0.1, late=True)], {"m": {"h"}})
    assert signal(plan(late, CFG, NOW), "model", "m").desired == 2
    s = snap([worker("h"), skipper], [queue("m", 120, est_s=2.0)], {"m": {"h"}})
    assert counts(plan(s, CFG, NOW))["L4"] == (1, 4)  # a shortfall of 3, none of it met by "s"
    assert counts(plan(replace(s, workers=(worker("h"), replace(skipper, skips=frozenset()))),
                       CFG, NOW))["L4"] == (1, 3)
    backlog = snap([worker("h"), skipper, worker("t", "L4", idle_gb=18)], [queue("m", 5, priority=1)],
                   {"m": {"h"}}, footprint_gb={"m": 14.0})
    assert plan(backlog, Config(), NOW).hints == [WarmHint("t", "m", 14.0)]
    assert plan(replace(backlog, workers=backlog.workers[:2]), Config(), NOW).hints == []


def test_a_class_whose_live_workers_are_all_lanes_is_not_asked_to_grow_for_work_they_skip() -> None:
    """Found by an operator's pass: a class of P0/P1 lanes was asked for more workers for a
    P2/P3 backlog its workers never take (another lane of it would not either, and an
    autoscaler adding one would add it again each round). The shortfall goes to the next
    class that holds it; to the lanes' class only when every class that does is like it."""
    lanes = [worker("l1", levels="01"), worker("l2", levels="01")]
    batch = [queue("m", 40, priority=3, est_s=30.0, vram_gb=40)]
    assert counts(plan(snap(lanes, batch), CFG, NOW)) == {"L4": (0, 0), "A100": (2, 2), "H200": (0, 20)}
    online = [queue("m", 40, priority=0, est_s=30.0, vram_gb=40)]
    assert counts(plan(snap(lanes, online), CFG, NOW))["A100"] == (2, 22)
    every = snap([*lanes, worker("h", "H200", levels="0")], batch)
    assert counts(plan(every, CFG, NOW)) == {"L4": (0, 0), "A100": (2, 22), "H200": (1, 1)}


def test_of_two_classes_of_one_shape_the_one_with_live_workers_is_asked_to_grow() -> None:
    """Found by a groups user: a class registered once by a test worker (2x2xA100, never
    removed) sorted first by name and was asked to grow from 0 while the live class of the
    same shape (2xA100) stayed as it was."""
    shapes = {"2xA100": 150.0, "2x2xA100": 150.0}
    live = WorkerState("g2", "2xA100", 150.0, "0123", None, gpus=2)
    late = Backlog(0, "m", 1, NOW - 1, ((100.0, 1.0, 2),))
    s = Snapshot((live,), (late,), shapes, {"m": frozenset({"g2"})},
                 class_gpus={"2xA100": 2, "2x2xA100": 2})
    assert counts(plan(s, CFG, NOW)) == {"2xA100": (1, 2), "2x2xA100": (0, 0)}
