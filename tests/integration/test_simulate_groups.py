"""Replays with multi-GPU workers: group shapes in --gpus, 70B models on two GPUs, the
scripts placing them only on groups large enough, in gpuq and the baselines alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from procs import Procs
from test_simulate import fixed_load, trace_dir  # noqa: F401 (a fixture)

from gpuq.embedded import EmbeddedServer
from gpuq.errors import ConfigError
from gpuq.sim.mix import VRAM_GB, with_70b
from gpuq.sim.model import TraceTask, devices_of
from gpuq.sim.run import parse_gpus, simulate
from gpuq.sim.traces import LoadTimes


def test_group_shapes_parse_into_workers_that_carry_their_group() -> None:
    gpus = parse_gpus("2x4x80,1x80,1x2x80/01,1x4x80")
    assert gpus == [("gpu4x80-0", 320.0), ("gpu4x80-1", 320.0), ("gpu80-0", 80.0),
                    ("gpu2x80-0@01", 160.0), ("gpu4x80-2", 320.0)]
    assert [devices_of(w) for w, _ in gpus] == [4, 4, 1, 2, 4]
    with pytest.raises(ConfigError, match="COUNTx\\[GPUSx\\]GB"):
        parse_gpus("2x0x80")


def tasks(n: int) -> list[TraceTask]:
    """Alternating 70B requests (two GPUs) and small ones, one second apart."""
    out = []
    for i in range(n):
        big = i % 2 == 0
        out.append(TraceTask(float(i), "llama-70b" if big else f"small-{i % 3}", VRAM_GB if big else 20.0,
                             1, 5.0, 5.0, gpus=2 if big else 1))
    return out


@pytest.mark.parametrize("policy", ["gpuq", "fifo", "priority"])
def test_70b_tasks_run_only_on_the_two_gpu_group(redis_server: EmbeddedServer, policy: str) -> None:
    r = simulate(tasks(40), parse_gpus("2x80,1x2x80"), policy, speedup=1.0, load_time=fixed_load,
                 server=redis_server)
    ran = {t.id: t for t in r.tasks}
    assert all(t.outcome == "succeeded" for t in ran.values())
    big = [t for t in ran.values() if t.model == "llama-70b"]
    assert len(big) == 20 and {t.worker for t in big} == {"gpu2x80-0"}


def test_a_pool_without_a_group_refuses_70b_tasks_up_front(redis_server: EmbeddedServer) -> None:
    """A 200 GB single GPU has the VRAM but not the devices the task shards over."""
    r = simulate(tasks(10), parse_gpus("2x200"), "gpuq", speedup=1.0, load_time=fixed_load,
                 server=redis_server)
    assert r.rejected == 5 and {t.model for t in r.tasks} == {"small-0", "small-1", "small-2"}


def test_the_70b_mix_is_drawn_once_per_seed_and_loads_longer() -> None:
    trace = [TraceTask(float(i), f"M{i % 10}", 20.0, 1, 5.0, 5.0) for i in range(100)]
    loads = LoadTimes([10.0])
    mixed, large = with_70b(trace, loads, 0.2, seed=3)
    again, same = with_70b(trace, LoadTimes([10.0]), 0.2, seed=3)
    assert large == same and len(large) == 2 and mixed == again
    assert {(t.vram_gb, t.gpus) for t in mixed if t.model in large} == {(VRAM_GB, 2)}
    assert {(t.vram_gb, t.gpus) for t in mixed if t.model not in large} == {(20.0, 1)}
    assert loads.mean_s(large[0]) == 20.0 and loads.mean_s("M-other") == 10.0
    with pytest.raises(ConfigError, match="--mix-70b must be a share in 0..1"):
        with_70b(trace, loads, 1.5, seed=3)


def test_cli_mix_70b_reports_70b_and_other_tasks(procs: Procs, trace_dir: Path) -> None:  # noqa: F811
    out = procs.cli("simulate", "--trace", "genai", "--traces-dir", str(trace_dir), "--limit", "150",
                    "--gpus", "1x2x80,2x80", "--mix-70b", "0.25", "--speedup", "3000",
                    "--policy", "gpuq", "--json", env={"GPUQ_REAP_INTERVAL_S": "1"})
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert len(report["models_70b"]) == 3  # a quarter of the trace's 12 models
    sizes = report["by_size"]
    assert sizes["70b"]["tasks"] > 0 and sizes["70b"]["tasks"] + sizes["other"]["tasks"] == 150
    text = procs.cli("simulate", "--trace", "genai", "--traces-dir", str(trace_dir), "--limit", "60",
                     "--gpus", "1x2x80,2x80", "--mix-70b", "0.25", "--speedup", "3000",
                     "--policy", "gpuq")
    assert text.returncode == 0 and "3 models made 70B (144 GB on 2 GPUs)" in text.stdout
    bad = procs.cli("simulate", "--trace", "genai", "--traces-dir", str(trace_dir), "--mix-70b", "2")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "Error: configuration: --mix-70b must be a share in 0..1, got 2"]
