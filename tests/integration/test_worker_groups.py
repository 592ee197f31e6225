"""A real worker process on a group of (declared) GPUs: it registers the group, runs the task
that asks for its GPUs while a one-GPU worker cannot, and the CLI speaks of groups."""

from __future__ import annotations

import json

import pytest
from procs import Procs, est

from gpuq import Queue, State

pytestmark = pytest.mark.slow


def test_a_70b_task_runs_on_the_two_gpu_group(procs: Procs, real_queue: Queue) -> None:
    procs.worker("single", vram_gb=80, gpu_name="A100")
    procs.worker("pair", vram_gb=80, gpu_name="A100", gpu_count=2)
    fields = procs.redis.hgetall(procs.keys.worker("pair"))
    assert (fields["gpus"], fields["gpu_name"], fields["vram_total_gb"], fields["kv_reserve_gb"]) \
        == ("2", "2xA100", "160.0", "10.0")
    out = procs.cli("enqueue", "sim.run", "--model", "llama-70b", "--vram-gb", "140", "--gpus", "2",
                    "--priority", "P1", "--est-s", str(est(0.1)), "--check-fit", "--wait",
                    "--timeout", "20")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert (result["worker"], result["model"]) == ("pair", "llama-70b")
    # a one-GPU task still goes to the one-GPU worker that fits it (the group stays free)
    small = real_queue.enqueue("sim.run", {}, model="m-small", vram_gb=20, priority="P1",
                               est_s=est(0.05))
    assert small.result(timeout=15)["worker"] == "single"
    status = procs.status()
    shapes = {w["id"]: (w["gpu"], w["vram_total_gb"], w["gpus"]) for w in status["workers"]}
    assert shapes == {"single": ("A100", 80.0, 1), "pair": ("2xA100", 160.0, 2)}


def test_the_cli_refuses_more_gpus_than_any_group_has_in_one_line(procs: Procs) -> None:
    procs.worker("pair", vram_gb=80, gpu_name="A100", gpu_count=2)
    out = procs.cli("enqueue", "sim.run", "--model", "llama-405b", "--vram-gb", "300", "--gpus", "4",
                    "--check-fit")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "Error: unschedulable: task needs 4 GPUs, the largest GPU group registered in this pool has 2"]
    bad = procs.cli("enqueue", "sim.run", "--model", "m", "--vram-gb", "1", "--gpus", "0")
    assert bad.returncode != 0 and "gpus must be an integer in 1..64" in bad.stderr
    assert procs.redis.zcard(procs.keys.need) == 0  # nothing was stored


def test_a_task_for_a_group_waits_while_only_single_gpus_run(procs: Procs, real_queue: Queue) -> None:
    procs.worker("single", vram_gb=200, gpu_name="B200")
    task = real_queue.enqueue("sim.run", {}, model="llama-70b", vram_gb=140, gpus=2,
                              est_s=est(0.05))
    procs.wait_state(task.id, State.QUEUED)
    small = real_queue.enqueue("sim.run", {}, model="m", vram_gb=10, est_s=est(0.05))
    small.result(timeout=15)
    assert task.status() is State.QUEUED
    procs.worker("pair", vram_gb=80, gpu_name="A100", gpu_count=2)
    assert task.result(timeout=15)["worker"] == "pair"


def test_a_one_gpu_task_goes_to_the_one_gpu_holder_of_its_model_not_the_group(
        procs: Procs, real_queue: Queue) -> None:
    """Found by a QA pass: with both idle and holding the task's model, the group ("g2",
    first by name) took the one-GPU task, and a task only the group could run waited behind
    it. The tightest idle holder (least claimable VRAM) is offered the task now."""
    procs.worker("s1", vram_gb=80, gpu_name="A100")  # alone: it loads the model first
    real_queue.enqueue("sim.run", {}, model="shared", vram_gb=20, est_s=est(0.05)).result(timeout=15)
    procs.worker("g2", vram_gb=80, gpu_name="A100", gpu_count=2)
    real_queue.enqueue("sim.run", {}, model="shared", vram_gb=20, gpus=2,
                       est_s=est(0.05)).result(timeout=15)
    holders = lambda: procs.redis.smembers(procs.keys.holders("shared"))  # noqa: E731
    assert holders() == {"g2", "s1"}
    procs.wait_idle("g2")
    procs.wait_idle("s1")
    one = real_queue.enqueue("sim.run", {}, model="shared", vram_gb=20, est_s=est(0.05))
    assert one.result(timeout=15)["worker"] == "s1"
