"""The simulator's autoscaler: GPUs boot and retire on the virtual clock, and the forecast
signal boots them before a daily burst that the reactive one only answers."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from statistics import mean

import pytest
from click.testing import CliRunner

from gpuq.cli import cli
from gpuq.config import Config
from gpuq.connection import connect
from gpuq.embedded import EmbeddedServer
from gpuq.errors import ConfigError
from gpuq.reaper.scale_plan import ScalePlan
from gpuq.sim.autoscale import Autoscale
from gpuq.sim.engine import EPOCH_MS, Engine
from gpuq.sim.model import SimResult, TraceTask
from gpuq.sim.policies import GpuqScheduler
from gpuq.sim.report import summarize
from gpuq.sim.run import autoscaled_config, parse_gpus, sim_config, simulate

DAY_S = 4 * 3600.0  # the replay's "day"
BURST_AT = 3600.0  # into each day
BURST = 40


def fixed_load(model: str, rng: random.Random) -> float:
    return 10.0


def daily_trace(days: int = 2) -> list[TraceTask]:
    """A P2 task of model bg every 5 min, and each day at BURST_AT a burst of 40 tasks of
    20 s over 5 min, spread over four models."""
    out = [TraceTask(t, "bg", 20.0, 2, 5.0, 5.0) for t in range(0, int(days * DAY_S), 300)]
    for d in range(days):
        out += [TraceTask(d * DAY_S + BURST_AT + i * 7.5, f"m{i % 4}", 20.0, 2, 20.0, 20.0)
                for i in range(BURST)]
    return sorted(out, key=lambda t: t.arrival_s)


def replay(server: EmbeddedServer, signal: str, tasks: list[TraceTask], spec: Autoscale) -> SimResult:
    return simulate(tasks, [], "gpuq", speedup=1.0, load_time=fixed_load, server=server,
                    config=replace(Config(), scale_signal=signal, forecast_day_s=DAY_S), autoscale=spec)


def burst_wait(result: SimResult, day: int) -> float:
    start = day * DAY_S + BURST_AT
    return mean(t.start_s - t.arrival_s for t in result.tasks  # type: ignore[operator]
                if t.model != "bg" and start <= t.arrival_s < start + 600)


def burst_colds(result: SimResult, day: int) -> int:
    start = day * DAY_S + BURST_AT
    return sum(1 for t in result.tasks if t.model != "bg" and start <= t.arrival_s < start + 600
               and t.cold_start)


def test_gpus_boot_for_a_backlog_and_retire_when_idle(redis_server: EmbeddedServer) -> None:
    spec = Autoscale(1, 4, 80.0, boot_s=60.0, idle_s=300.0, every_s=15.0)
    result = replay(redis_server, "reactive", daily_trace(1), spec)
    assert all(t.outcome == "succeeded" for t in result.tasks)
    a = result.autoscale
    assert a is not None and a["boots"] >= 1 and a["peak_gpus"] == 4
    assert a["retired"] == a["boots"]  # back to the minimum once the burst is over
    makespan = max(t.end_s or 0 for t in result.tasks)
    # the minimum's GPU all along, plus each booted one from its boot to its retirement
    assert makespan / 3600 < a["gpu_hours"] < makespan / 3600 + a["boots"] * 0.5
    report = summarize(result)
    assert report["autoscale"] == a
    assert 0 < report["gpu_busy_fraction"] <= 1  # over the GPU time the pool had


def test_the_forecast_boots_before_yesterdays_burst(redis_server: EmbeddedServer) -> None:
    spec = Autoscale(1, 4, 80.0, boot_s=60.0, idle_s=300.0, every_s=15.0)
    tasks = daily_trace(2)
    reactive = replay(redis_server, "reactive", tasks, spec)
    ahead = replay(redis_server, "forecast", tasks, spec)
    # the first day has no history: only the trend sees the burst, once it has begun
    assert burst_wait(ahead, 0) <= burst_wait(reactive, 0)
    # the second day the GPUs are up when the burst comes, its models preloaded
    assert burst_wait(ahead, 1) < min(0.8 * burst_wait(reactive, 1), burst_wait(ahead, 0))
    assert burst_colds(ahead, 1) == 0 < burst_colds(reactive, 1)
    assert ahead.autoscale is not None and reactive.autoscale is not None


def hinted(server: EmbeddedServer, tasks: list[TraceTask]) -> tuple[Engine, GpuqScheduler]:
    """A one-GPU autoscaled replay whose scaler's first step (15 s) leaves ``preload m 20`` on
    the GPU's control list; loads take 30 s."""
    spec = Autoscale(1, 1, 80.0)
    cfg = autoscaled_config(sim_config(), spec, 1.0)
    client = connect(server.url)
    client.flushdb()
    scheduler = GpuqScheduler(client, cfg)
    scaler = scheduler.reaper.scaler
    step = scaler.step

    def hinting(now_ms: int | None = None) -> ScalePlan:
        result = step(now_ms)
        if now_ms == at_ms(15.0):  # the first step: as if it had planned the hint
            client.lpush(scheduler.keys.control(spec.gpu_id(0)), "preload m 20")
        return result

    scaler.step = hinting  # type: ignore[method-assign]
    engine = Engine(scheduler, [], tasks, lambda model: 30.0, cfg, spec)
    engine.run()
    return engine, scheduler


def at_ms(t: float) -> int:
    return EPOCH_MS + int(t * 1000)


def test_a_warm_hint_loads_the_model_while_the_gpu_stays_free(redis_server: EmbeddedServer) -> None:
    engine, scheduler = hinted(redis_server, [TraceTask(100.0, "m", 20.0, 1, 5.0, 5.0),
                                              TraceTask(110.0, "other", 20.0, 1, 5.0, 5.0)])
    warm, cold = engine.records["t000000"], engine.records["t000001"]
    # the preload (15 s to 45 s) left m loaded: its task starts at once, the other loads
    assert (warm.exec_s, warm.cold_start) == (100.0, False)
    assert cold.cold_start and cold.exec_s == 140.0
    assert engine.loads == 2
    assert scheduler.redis.smembers(scheduler.keys.holders("m")) == {"gpu80-0"}


def test_a_task_claimed_during_its_models_preload_waits_for_the_load(
        redis_server: EmbeddedServer) -> None:
    engine, _ = hinted(redis_server, [TraceTask(20.0, "m", 20.0, 1, 5.0, 5.0)])
    task = engine.records["t000000"]
    assert (task.start_s, task.exec_s, task.cold_start) == (20.0, 45.0, False)
    assert task.load_wait_s == 25.0 and engine.loads == 1


def test_a_fixed_pool_reports_no_autoscale(redis_server: EmbeddedServer) -> None:
    tasks = daily_trace(1)[:20]
    result = simulate(tasks, parse_gpus("2x80"), "gpuq", speedup=1.0, load_time=fixed_load,
                      server=redis_server)
    assert result.autoscale is None and "autoscale" not in summarize(result)


def test_bad_autoscale_options_are_one_line() -> None:
    for spec in ("3", "0:2", "4:2", "a:b"):
        with pytest.raises(ConfigError, match="MIN:MAX"):
            Autoscale.parse(spec, 80.0)
    with pytest.raises(ConfigError, match="--scale-every-s"):
        Autoscale.parse("1:2", 80.0, every_s=0)


def test_cli_replays_both_signals(tmp_path: Path) -> None:
    path = tmp_path / "requests.csv"
    rows = ["arrival_s,model,priority,service_s,vram_gb,load_s"]
    rows += [f"{t.arrival_s},{t.model},P2,{t.service_s},20,10" for t in daily_trace(1)]
    path.write_text("\n".join(rows) + "\n")
    got = CliRunner().invoke(cli, ["simulate", "--trace", str(path), "--gpus", "1x80", "--speedup", "1",
                                    "--autoscale", "1:3", "--json"])
    assert got.exit_code == 0, got.output
    reports = json.loads(got.stdout)
    assert [r["policy"] for r in reports] == ["reactive", "forecast"]
    assert all(r["autoscale"]["max"] == 3 and r["succeeded"] == r["tasks"] for r in reports)
    text = CliRunner().invoke(cli, ["simulate", "--trace", str(path), "--gpus", "1x80", "--speedup", "1",
                                     "--autoscale", "1:3", "--scale-signal", "forecast"])
    assert text.exit_code == 0 and "GPU-HOURS" in text.output
    # regression: the heading counted every GPU booted as the pool ("on 107 workers (107x80 GB)")
    boots = reports[1]["autoscale"]["boots"]
    peak = reports[1]["autoscale"]["peak_gpus"]
    assert text.stdout.startswith(f"trace {path}: {reports[1]['tasks']} tasks on 1-3 autoscaled "
                                  f"workers of 80 GB (at most {peak} at once; {boots} boots), ")
    bad = CliRunner().invoke(cli, ["simulate", "--trace", str(path), "--gpus", "1x80,1x48",
                                    "--autoscale", "1:3"])
    assert bad.exit_code != 0 and "one GPU kind" in bad.output


def test_autoscale_and_find_gpus_refuse_groups_they_would_replay_as_one_gpu(tmp_path: Path) -> None:
    # 1x2x80 is a worker of two 80 GB GPUs; these modes make pools of single GPUs of one size,
    # so it would be replayed (and billed in gpu_hours) as one 160 GB GPU
    path = tmp_path / "requests.csv"
    path.write_text("arrival_s,model,priority,service_s,vram_gb,load_s\n0,m,P0,1,20,1\n")
    for mode in (["--autoscale", "1:2"], ["--find-gpus"]):
        got = CliRunner().invoke(cli, ["simulate", "--trace", str(path), "--gpus", "1x2x80",
                                       "--speedup", "1", *mode])
        assert got.exit_code != 0, (mode, got.output)
        assert f"{mode[0]} needs one GPU kind, of single GPUs" in got.output
