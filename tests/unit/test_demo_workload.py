"""The demo's requests and settings tell the scheduler the times its simulated GPUs take."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gpuq.app import Context
from gpuq.demo import WORKLOAD, Fleet, new_task
from workers.sim import SimModel, run


@pytest.mark.parametrize("time_scale", [0.05, 1.0])
def test_a_demo_task_s_estimate_is_its_run_at_the_time_scale(time_scale: float) -> None:
    rng = random.Random(7)
    for n in range(200):
        task = new_task(rng, n, time_scale)
        run_s = task["payload"]["run_s"]
        kinds = [k for k in WORKLOAD if (k.model, k.priority) == (task["model"], task["priority"])]
        assert any(k.est_lo <= run_s <= k.est_hi for k in kinds)
        # what the holder wait and the planner read is what the simulated GPU will take
        assert task["est_s"] == round(run_s * time_scale, 4)


def test_sim_run_sleeps_the_payload_s_run_at_the_time_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUQ_SIM_TIME_SCALE", "0.01")
    ctx = Context("t1", 1, "w1", "m", 1.0, est_s=0.002)
    ran = run(SimModel("m"), {"run_s": 5.0}, ctx)["ran_s"]
    assert 0.05 <= ran < 1.0  # 5 s at 0.01, not the estimate's 0.002 s scaled again
    assert run(SimModel("m"), {}, Context("t2", 1, "w1", "m", 1.0, est_s=3.0))["ran_s"] >= 0.03


def test_the_demo_scales_a_victims_minimum_runtime_with_its_gpus(tmp_path: Path) -> None:
    """A victim's minimum runtime counts GPU work, which the demo's GPUs do time_scale as
    fast; left at 1 s it outlasted most demo tasks, and online work behind busy GPUs waited
    for natural ends (docs/DECISIONS.md, Simulator)."""
    fleet = Fleet("redis://127.0.0.1:1", "p", 0.05, tmp_path, 1.0)
    assert float(fleet.env["GPUQ_PREEMPT_MIN_RUNTIME_S"]) == pytest.approx(0.05)
    assert fleet.env["GPUQ_SIM_TIME_SCALE"] == "0.05"
