"""Fixed-pool replays run the reaper's scale step every round and take its warm hints; only
the steps that may hint run (gpuq.sim.hints), with the same report as running them all."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from gpuq.config import Config
from gpuq.embedded import EmbeddedServer
from gpuq.sim.model import SimResult, TraceTask
from gpuq.sim.report import summarize
from gpuq.sim.run import parse_gpus, simulate

LOAD_S = 30.0


def fixed_load(model: str, rng: random.Random) -> float:
    return LOAD_S


def task(t: float, model: str, priority: int, service: float) -> TraceTask:
    return TraceTask(t, model, 20.0, priority, service, service, None, priority >= 2)


def replay(server: EmbeddedServer, tasks: list[TraceTask], config: Config, every_round: bool = False,
           load_time: object = fixed_load, warm_hints: bool = True) -> SimResult:
    return simulate(tasks, parse_gpus("2x80"), "gpuq", speedup=1.0, load_time=load_time,  # type: ignore[arg-type]
                    config=config, server=server, skip_ahead=not every_round, warm_hints=warm_hints)


@pytest.mark.parametrize("every_round", [False, True])
def test_a_backlog_hint_warms_an_idle_gpu_for_the_tasks_waiting_on_a_busy_holder(
        redis_server: EmbeddedServer, every_round: bool) -> None:
    # gpu80-0 loads m for the first task and runs it 100 s; the next five (P2) wait for it, the
    # busy holder, rather than load m cold on the idle gpu80-1: a backlog of warm_backlog
    tasks = [task(0, "m", 2, 100.0)] + [task(1 + i, "m", 2, 10.0) for i in range(5)]
    r = replay(redis_server, tasks, replace(Config(), scale_signal="reactive"), every_round)
    waiting = r.tasks[1:]
    # the step of the round of the fourth waiting task's arrival (4 s) hints gpu80-1, which
    # loads m by 34 s and takes the waiting tasks warm
    assert all(t.worker == "gpu80-1" and not t.cold_start for t in waiting[:3])
    assert min(t.exec_s or 0 for t in waiting) == 4 + LOAD_S
    assert r.model_loads == 2 and sum(t.cold_start for t in r.tasks) == 1


@pytest.mark.parametrize("every_round", [False, True])
def test_a_forecast_hint_warms_a_second_copy_for_the_next_online_task(
        redis_server: EmbeddedServer, every_round: bool) -> None:
    # an online task holds gpu80-0 for 100 s; its model is expected again (one arrival in the
    # window), so gpu80-1 preloads it in the next round, and the task at 60 s starts warm there
    tasks = [task(0, "m", 1, 100.0), task(60, "m", 1, 5.0)]
    r = replay(redis_server, tasks, Config(), every_round)
    second = r.tasks[1]
    assert (second.worker, second.cold_start, second.exec_s) == ("gpu80-1", False, 60.0)
    assert r.model_loads == 2


def test_without_the_forecast_the_same_task_starts_cold(redis_server: EmbeddedServer) -> None:
    tasks = [task(0, "m", 1, 100.0), task(60, "m", 1, 5.0)]
    r = replay(redis_server, tasks, replace(Config(), scale_signal="reactive"))
    assert r.tasks[1].cold_start and r.tasks[1].exec_s == 60.0 + LOAD_S


def bursty(n: int, seed: int) -> list[TraceTask]:
    """Bursts and lulls over ten models, a day of 20 minutes repeating: the forecast's level,
    trend and seasons all move, and idle GPUs come and go."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(n):
        t += rng.choice([0.0, 0.5, 2.0, 20.0, 60.0, 240.0])
        model = f"m{min(int(rng.expovariate(0.4)), 9)}"
        out.append(TraceTask(t, model, rng.choice([14.0, 20.0, 30.0]), rng.randint(0, 3),
                             rng.uniform(5, 60), 30.0, None, True))
    return out


@pytest.mark.slow
def test_running_only_the_steps_that_may_hint_gives_the_same_replay(redis_server: EmbeddedServer) -> None:
    config = replace(Config(), forecast_window_s=600.0, forecast_half_life_s=120.0, forecast_day_s=1200.0)
    tasks = bursty(260, 4)

    def load(model: str, rng: random.Random) -> float:
        return rng.uniform(5.0, 60.0)

    runs = [replay(redis_server, tasks, config, every_round, load) for every_round in (False, True)]
    reports = [json.dumps({k: v for k, v in summarize(r).items() if k != "wall_s"}, sort_keys=True)
               for r in runs]
    assert reports[0] == reports[1]
    assert runs[0].claims == runs[1].claims
    assert runs[0].model_loads > sum(t.cold_start for t in runs[0].tasks)  # some hints were taken


def test_without_warm_hints_a_fixed_pool_takes_none(redis_server: EmbeddedServer) -> None:
    """The default replay (bench_sched's): the reaper's hints reach no GPU, so the waiting
    tasks wait for the busy holder and the idle GPU loads nothing."""
    tasks = [task(0, "m", 2, 100.0)] + [task(1 + i, "m", 2, 10.0) for i in range(5)]
    config = replace(Config(), scale_signal="reactive")
    with_hints = replay(redis_server, tasks, config)
    without = replay(redis_server, tasks, config, warm_hints=False)
    assert sum(t.cold_start for t in with_hints.tasks) == 1
    assert sum(t.cold_start for t in without.tasks) > 1  # the idle GPU loads m only for a task
