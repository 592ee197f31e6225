"""gpuq.reaper.scale_plan with forecasts: desired workers ahead of a rise (no Redis)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpuq.config import Config
from gpuq.reaper.forecast import Forecast
from gpuq.reaper.scale_plan import ScalePlan, ScaleSignal, plan
from gpuq.reaper.snapshot import Backlog, Snapshot, WorkerState

NOW = 1_700_000_000_000
CLASSES = {"L4": 19.0, "A100": 75.0, "H200": 136.0}


def queue(model: str, depth: int, *, est_s: float = 1.0, vram_gb: float = 16.0) -> Backlog:
    return Backlog(2, model, depth, NOW + 60_000, ((vram_gb, est_s, 1),) * min(depth, 50))


def worker(wid: str, gpu: str = "A100", *, idle_gb: float | None = None) -> WorkerState:
    return WorkerState(wid, gpu, CLASSES[gpu], "0123", idle_gb)


def snap(workers: Sequence[WorkerState], backlogs: Sequence[Backlog],
         holders: dict[str, set[str]]) -> Snapshot:
    return Snapshot(tuple(workers), tuple(backlogs), CLASSES,
                    {m: frozenset(ws) for m, ws in holders.items()})


CFG = Config(min_workers=0, forecast_utilisation=0.5, forecast_margin=0.0)


def rise(model: str, now: float, ahead: float, horizon_s: float = 60.0) -> Forecast:
    return Forecast(model, now, ahead, horizon_s, ahead, None)


def signal(result: ScalePlan, kind: str, name: str) -> ScaleSignal:
    (s,) = [s for s in result.signals if (s.kind, s.name) == (kind, name)]
    return s


def test_a_rise_with_no_backlog_asks_for_workers_before_the_backlog() -> None:
    s = Snapshot((worker("w1"),), (), CLASSES, {}, footprint_gb={"m": 30.0},
                 forecasts={"m": rise("m", 0.05, 0.4)}, est_s={"m": 5.0})
    result = plan(s, CFG, NOW)
    m = signal(result, "model", "m")
    # 0.4/s x 5 s / 0.5 = 4 workers; no backlog, no holder
    assert (m.current, m.desired) == (0, 4)
    assert m.reason.startswith("forecast 0.4/s in 60 s") and (m.rate_per_s, m.forecast_per_s) == (0.05, 0.4)
    a100 = signal(result, "class", "A100")  # the smallest class that fits 30 GB
    assert (a100.current, a100.desired) == (1, 4) and a100.reason.startswith("forecast 0.4/s")
    assert a100.forecast_per_s == 0.4
    assert a100.fields(NOW, 1.0)["forecast_per_s"] == 0.4
    assert signal(result, "class", "L4").desired == 0


def test_the_reactive_signal_ignores_the_forecast_but_reports_it() -> None:
    s = Snapshot((worker("w1"),), (), CLASSES, {}, footprint_gb={"m": 30.0},
                 forecasts={"m": rise("m", 0.05, 0.4)}, est_s={"m": 5.0})
    result = plan(s, Config(min_workers=0, scale_signal="reactive"), NOW)
    assert [x.hash_field for x in result.signals if x.kind == "model"] == []
    a100 = signal(result, "class", "A100")
    assert (a100.current, a100.desired, a100.reason) == (1, 1, "enough workers")
    assert a100.forecast_per_s == 0.4  # the rates are still published


def test_no_rise_leaves_the_reactive_rule_alone() -> None:
    backlog = snap([worker("h")], [queue("m", 120, est_s=2.0)], {"m": {"h"}})
    flat = Snapshot(backlog.workers, backlog.backlogs, CLASSES, backlog.holders,
                    forecasts={"m": rise("m", 0.4, 0.4)})
    reactive = signal(plan(backlog, CFG, NOW), "model", "m")
    got = signal(plan(flat, CFG, NOW), "model", "m")
    assert (got.current, got.desired, got.reason) == (reactive.current, reactive.desired, reactive.reason)
    assert got.forecast_per_s == 0.4 and reactive.forecast_per_s is None
    assert "forecast_per_s" not in reactive.fields(NOW, 1.0)


def test_a_rise_raises_a_backlogged_model_above_the_reactive_rule() -> None:
    base = snap([worker("h")], [queue("m", 10, est_s=2.0)], {"m": {"h"}})
    s = Snapshot(base.workers, base.backlogs, CLASSES, base.holders,
                 forecasts={"m": rise("m", 0.5, 2.0)})
    m = signal(plan(s, CFG, NOW), "model", "m")
    # reactive: 20 s of work, one holder: 1; forecast: 2/s x 2 s (the sample's est) / 0.5 = 8
    assert (m.current, m.desired) == (1, 8) and "backlog 10 tasks" in m.reason
    assert m.reason.startswith("forecast 2/s")


def test_the_class_counts_the_load_not_a_worker_per_model() -> None:
    """Ten models each rising to 0.01/s of 10 s tasks: 1 GPU-s/s at 0.5 is 2 workers for the
    class, though each model alone would ask for one."""
    models = {f"m{i}": rise(f"m{i}", 0.0, 0.01) for i in range(10)}
    s = Snapshot((), (), {"A100": 75.0}, {}, forecasts=models, est_s=dict.fromkeys(models, 10.0))
    result = plan(s, CFG, NOW)
    assert all(signal(result, "model", m).desired == 1 for m in models)
    assert signal(result, "class", "A100").desired == 2


def test_idle_workers_already_cover_a_rise() -> None:
    idle = [worker("a", idle_gb=75.0), worker("b", idle_gb=75.0)]
    s = Snapshot(tuple(idle), (), {"A100": 75.0}, {}, forecasts={"m": rise("m", 0.0, 0.05)},
                 est_s={"m": 10.0})
    assert signal(plan(s, CFG, NOW), "class", "A100").desired == 2  # 0.5/0.5 = 1 <= 2 live


def test_a_backlog_the_live_workers_drain_before_a_new_one_could_start_asks_for_none() -> None:
    """One busy holder, 80 s of queued work; a new worker would start after the 60 s lead
    and the model's 20 s load: by then the holder has done it all."""
    s = Snapshot((worker("h"),), (queue("m", 2, est_s=40.0),), {"A100": 75.0}, {"m": frozenset({"h"})},
                 load_s={"m": 20.0})
    ahead = Config(min_workers=0, forecast_lead_s=60.0)
    a100 = signal(plan(s, ahead, NOW), "class", "A100")
    assert (a100.current, a100.desired) == (1, 1) and "the 1 live drain it within 80 s" in a100.reason
    assert signal(plan(s, replace(ahead, scale_signal="reactive"), NOW), "class", "A100").desired == 2
    more = Snapshot(s.workers, (queue("m", 3, est_s=40.0),), s.classes, s.holders, load_s=s.load_s)
    reactive = signal(plan(more, replace(ahead, scale_signal="reactive"), NOW), "class", "A100")
    assert signal(plan(more, ahead, NOW), "class", "A100").desired == reactive.desired == 3  # 40 s left


def test_the_margin_leaves_part_of_a_worker_of_forecast_load_to_the_live_ones() -> None:
    # 0.06/s x 10 s / 0.5 = 1.2 workers: one more than the live one, unless 0.2 is left to it
    s = Snapshot((worker("w1"),), (), {"A100": 75.0}, {}, forecasts={"m": rise("m", 0.0, 0.06)},
                 est_s={"m": 10.0})
    assert signal(plan(s, CFG, NOW), "class", "A100").desired == 2
    assert signal(plan(s, replace(CFG, forecast_margin=0.25), NOW), "class", "A100").desired == 1


def test_forecast_hints_leave_lane_workers_alone() -> None:
    """The forecast knows no priorities: a P0/P1 lane's room is kept for its levels (a lane
    preloading a batch model sent the next 8 GB P1 task to another GPU)."""
    lane = WorkerState("lane", "A100", CLASSES["A100"], "01", 75.0)
    full = WorkerState("full", "A100", CLASSES["A100"], "0123", 75.0)
    s = Snapshot((lane,), (), CLASSES, {}, footprint_gb={"m": 30.0},
                 forecasts={"m": rise("m", 0.05, 0.4)}, est_s={"m": 5.0})
    assert plan(s, CFG, NOW).hints == []
    hints = plan(replace(s, workers=(lane, full)), CFG, NOW).hints
    assert [(h.worker, h.model) for h in hints] == [("full", "m")]


def test_forecast_hints_leave_workers_skipping_a_model_alone() -> None:
    """A worker whose claims skip a model (its load failed there) passes its preload over:
    the hint, kept from others for HINT_EVERY_MS, was lost."""
    skipper = WorkerState("s", "A100", CLASSES["A100"], "0123", 75.0, skips=frozenset({"m"}))
    full = WorkerState("full", "A100", CLASSES["A100"], "0123", 75.0)
    s = Snapshot((skipper,), (), CLASSES, {}, footprint_gb={"m": 30.0},
                 forecasts={"m": rise("m", 0.05, 0.4)}, est_s={"m": 5.0})
    assert plan(s, CFG, NOW).hints == []
    assert [(h.worker, h.model) for h in plan(replace(s, workers=(skipper, full)), CFG, NOW).hints] == [
        ("full", "m")]


def test_forecast_hints_go_only_to_a_group_with_the_gpus_the_models_tasks_ask() -> None:
    """Found by a QA pass: a one-GPU worker preloaded a model whose tasks asked four GPUs.
    The GPUs a model's tasks ask: this step's queue samples, else those seen before."""
    one = WorkerState("one", "A100", CLASSES["A100"], "0123", 75.0)
    group = WorkerState("group", "A100", 4 * CLASSES["A100"], "0123", 300.0, gpus=4)
    s = Snapshot((one,), (), CLASSES, {}, footprint_gb={"m": 30.0},
                 forecasts={"m": rise("m", 0.05, 0.4)}, est_s={"m": 5.0}, gpus_seen={"m": 4})
    assert plan(s, CFG, NOW).hints == []
    assert [(h.worker, h.model) for h in plan(replace(s, workers=(one, group)), CFG, NOW).hints] \
        == [("group", "m")]
    sampled = replace(s, gpus_seen={}, backlogs=(Backlog(2, "m", 1, NOW + 60_000, ((30.0, 5.0, 4),)),))
    assert all(h.worker != "one" for h in plan(sampled, CFG, NOW).hints)


def test_a_model_without_queued_work_is_booked_to_the_class_its_tasks_were_seen_to_need() -> None:
    """Found by an integrator: once its queue drained, a 2-GPU model's arrival rate (and the
    desired workers it drives) went to the one-GPU A100 class, and a model never loaded (no
    footprint), the 200 GB one no class holds included, to the smallest class."""
    classes = {**CLASSES, "2xL40S": 96.0}
    s = Snapshot((worker("a"),), (), classes, {}, class_gpus={"2xL40S": 2},
                 forecasts={"wide": rise("wide", 0.05, 3.0), "huge": rise("huge", 0.05, 3.0)},
                 est_s={"wide": 5.0, "huge": 5.0}, gpus_seen={"wide": 2},
                 need_seen={"wide": 40.0, "huge": 200.0})
    out = plan(s, CFG, NOW)
    booked = {sig.name: sig.rate_per_s for sig in out.signals if sig.kind == "class"}
    assert booked == {"L4": None, "A100": None, "H200": None, "2xL40S": 0.05}
    assert signal(out, "class", "2xL40S").desired > 0 and signal(out, "class", "A100").desired == 1
