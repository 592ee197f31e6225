"""Metrics end to end: a worker process serving its own metrics, the pool exporter and a
reaper on a real server; tasks driven through; both /metrics endpoints scraped over HTTP."""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest
from procs import Procs, est, wait_for
from prometheus_client.parser import text_string_to_metric_families

from gpuq import Queue, State
from gpuq.metrics import METRIC_NAMES

pytestmark = pytest.mark.slow

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> tuple[set[str], Samples]:
    """(family names, {(sample name, labels): value}) of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    families, samples = set(), {}
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return families, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def up(port: int) -> bool:
    try:
        scrape(port)
        return True
    except OSError:
        return False


def test_worker_and_exporter_metrics_count_what_ran(procs: Procs, real_queue: Queue) -> None:
    worker_port, exporter_port = free_port(), free_port()
    procs.worker("w1", vram_gb=48, env={"GPUQ_METRICS_PORT": str(worker_port)})
    exporter = procs.start("exporter", ["exporter", "--port", str(exporter_port), "--host", "127.0.0.1"])
    reaper = procs.reaper()
    wait_for(lambda: up(worker_port) and up(exporter_port), 15,
             message=lambda: f"both endpoints; logs:\n{procs.logs()}")

    def run(priority: str, n: int, handler: str = "sim.run") -> list[str]:
        return [real_queue.enqueue(handler, {}, model="m", vram_gb=10, priority=priority,
                                   est_s=est(0.02), max_attempts=1).id for _ in range(n)]

    ok = run("P0", 5) + run("P2", 3)
    bad = run("P1", 1, "sim.fail")
    procs.wait_all(ok, State.SUCCEEDED)
    procs.wait_all(bad, State.FAILED)
    canceled = real_queue.enqueue("sim.run", {}, model="huge", vram_gb=500, priority="P3")
    real_queue.cancel(canceled.id)
    stuck = real_queue.enqueue("sim.run", {}, model="huge", vram_gb=500, priority="P3")
    wait_for(lambda: "reaper.active" in reaper.log(), 10, message="the reaper")

    families, w = scrape(worker_port)
    assert {"gpuq_schedule_latency_seconds", "gpuq_task_phase_seconds", "gpuq_worker_tasks",
            "gpuq_gpu_vram_total_bytes", "gpuq_gpu_vram_usage_ratio"} <= families
    assert value(w, "gpuq_schedule_latency_seconds_count", priority="P0") == 5
    assert value(w, "gpuq_schedule_latency_seconds_count", priority="P2") == 3
    assert value(w, "gpuq_task_phase_seconds_count", phase="queue") == 9
    assert value(w, "gpuq_task_phase_seconds_count", phase="run") == 9  # the failing one's too
    assert value(w, "gpuq_task_phase_seconds_count", phase="load") == 1  # one cold load of m
    assert value(w, "gpuq_worker_tasks_total", outcome="succeeded", priority="P0") == 5
    assert value(w, "gpuq_worker_tasks_total", outcome="succeeded", priority="P2") == 3
    assert value(w, "gpuq_worker_tasks_total", outcome="failed", priority="P1") == 1
    assert value(w, "gpuq_gpu_vram_total_bytes", gpu="w1") == 48 * 2**30
    assert 0 < value(w, "gpuq_gpu_vram_usage_ratio", gpu="w1", source="ledger") < 1

    def exported() -> Samples | None:
        # the reaper parks the task no live worker holds (lua/park.lua) in the same round it
        # publishes its plan: wait for both, or the depth read races the park
        _, s = scrape(exporter_port)
        ran = value(s, "gpuq_workers_desired") or value(s, "gpuq_reaper_active")
        return s if ran and value(s, "gpuq_tasks_parked") else None

    e = wait_for(exported, 10, message="the reaper's first round in the exporter")
    assert value(e, "gpuq_tasks_enqueued_total") == 11
    assert value(e, "gpuq_tasks_total", outcome="succeeded", priority="P0") == 5
    assert value(e, "gpuq_tasks_total", outcome="succeeded", priority="P2") == 3
    assert value(e, "gpuq_tasks_total", outcome="failed", priority="P1") == 1
    assert value(e, "gpuq_tasks_total", outcome="canceled", priority="P3") == 1
    assert value(e, "gpuq_sla_starts_total", priority="P0") == 5  # first starts, met or not
    assert value(e, "gpuq_sla_starts_total") == 9
    assert value(e, "gpuq_model_loads_total", model="m") == 1
    assert value(e, "gpuq_model_load_seconds_total", model="m") > 0
    assert value(e, "gpuq_queue_depth", priority="P3", model="huge") == 0  # parked, out of its queue
    assert value(e, "gpuq_tasks_parked") == 1
    assert value(e, "gpuq_tasks_unschedulable") == 1
    assert value(e, "gpuq_workers", state="idle") == 1
    assert value(e, "gpuq_reaper_active") == 1
    assert value(e, "gpuq_workers_current", gpu_class="sim-48GB") == 1
    assert procs.record(stuck.id).state is State.QUEUED
    # every family served is one metrics.py documents
    served = families | {n for (n, _) in e}
    documented = set(METRIC_NAMES) | {n.removesuffix("_total") for n in METRIC_NAMES}
    assert {n for n in served if n.startswith("gpuq_")} <= documented | {
        f"{n}_{s}" for n in METRIC_NAMES for s in ("bucket", "sum", "count", "created")} | {
        f"{n.removesuffix('_total')}_created" for n in METRIC_NAMES}
    assert exporter.alive()


def test_no_metrics_port_means_no_server(procs: Procs) -> None:
    worker = procs.worker("w1", vram_gb=24)
    assert "worker.metrics" not in worker.log()


def test_the_sla_is_met_or_missed_when_the_handler_starts_with_its_model_loaded(
        procs: Procs, real_queue: Queue) -> None:
    """A P0 task handed to an idle worker at once whose model load (whisper-large: 0.4 s
    here) outlasts its 200 ms SLA missed it: counted when its handler started, in stats, the
    exporter's ratio and the worker's latency. The next task of that model starts warm: met."""
    worker_port, exporter_port = free_port(), free_port()
    procs.worker("w1", vram_gb=48, env={"GPUQ_METRICS_PORT": str(worker_port)})
    procs.start("exporter", ["exporter", "--port", str(exporter_port), "--host", "127.0.0.1"])
    wait_for(lambda: up(worker_port) and up(exporter_port), 15,
             message=lambda: f"both endpoints; logs:\n{procs.logs()}")

    def run_p0() -> str:
        procs.wait_idle("w1")  # handed over at enqueue: started in time
        task = real_queue.enqueue("sim.run", {}, model="whisper-large", vram_gb=6, priority="P0",
                                  est_s=est(0.02))
        procs.wait_all([task.id], State.SUCCEEDED)
        return task.id

    cold = run_p0()
    record = procs.record(cold)
    assert record.started_at is not None and record.started_at - record.enqueued_at < 0.2
    stats = procs.redis.hgetall(procs.keys.stats)
    assert stats["sla_missed:P0"] == "1" and "sla_met:P0" not in stats
    misses = [json.loads(m) for m in procs.redis.lrange(procs.keys.sla_misses, 0, -1)]
    assert [(m["id"], m["kind"]) for m in misses] == [(cold, "cold")] and misses[0]["wait_s"] >= 0.4
    run_p0()
    stats = procs.redis.hgetall(procs.keys.stats)
    assert (stats["sla_met:P0"], stats["sla_missed:P0"]) == ("1", "1")

    _, e = scrape(exporter_port)
    assert value(e, "gpuq_sla_attainment_ratio", priority="P0") == 0.5
    assert value(e, "gpuq_sla_starts_total", priority="P0", result="missed") == 1
    _, w = scrape(worker_port)
    assert value(w, "gpuq_schedule_latency_seconds_count", priority="P0") == 2
    assert value(w, "gpuq_schedule_latency_seconds_sum", priority="P0") >= 0.4  # the load
    assert value(w, "gpuq_task_phase_seconds_count", phase="load") == 1


def test_a_run_stopped_after_its_task_was_canceled_is_counted_lost(
        procs: Procs, real_queue: Queue) -> None:
    """Found by a QA pass: a handler still running its task when the task was canceled was
    stopped past the grace, and its run was counted under no outcome (it vanished from
    gpuq_worker_tasks_total; its metrics label was kept for the worker's life)."""
    worker_port = free_port()
    procs.worker("w1", vram_gb=48, env={"GPUQ_METRICS_PORT": str(worker_port), "GPUQ_GRACE_S": "0.5"})
    wait_for(lambda: up(worker_port), 15, message=lambda: f"endpoint; logs:\n{procs.logs()}")
    warm = real_queue.enqueue("sim.run", {}, model="bge-m3", vram_gb=6, priority="P1", est_s=est(0.01))
    procs.wait_all([warm.id], State.SUCCEEDED)  # loaded: the next task's handler starts at once
    task = real_queue.enqueue("sim.run", {"ignore_yield": True}, model="bge-m3", vram_gb=6,
                              priority="P2", est_s=est(60))
    procs.wait_running_on(task.id, "w1")
    wait_for(lambda: procs.redis.hget(procs.keys.stats, "sla_met:P2") is not None, 5)  # in its handler
    real_queue.cancel(task.id)
    wait_for(lambda: "task.stopped" in procs.logs(), 15, message=lambda: f"stopped; logs:\n{procs.logs()}")
    wait_for(lambda: value(scrape(worker_port)[1], "gpuq_worker_tasks_total", outcome="lost") == 1, 5,
             message=lambda: f"outcome lost; logs:\n{procs.logs()}")
    _, w = scrape(worker_port)
    assert value(w, "gpuq_worker_tasks_total", outcome="succeeded") == 1


def test_a_superseded_run_that_runs_on_is_stopped_past_the_grace_and_counted_lost(
        procs: Procs, real_queue: Queue) -> None:
    """Found by a QA pass: an operator's requeue of a running task let the same worker (a
    free slot) claim it again; the old run, superseded, left the worker's running set, so a
    handler ignoring ctx.should_stop() was never stopped (two runs of the task on one GPU)
    and its run was counted under no outcome. Past the grace it is stopped as a lost run."""
    worker_port = free_port()
    procs.worker("w1", vram_gb=48, concurrency=2,
                 env={"GPUQ_METRICS_PORT": str(worker_port), "GPUQ_GRACE_S": "0.5"})
    wait_for(lambda: up(worker_port), 15, message=lambda: f"endpoint; logs:\n{procs.logs()}")
    task = real_queue.enqueue("sim.run", {"ignore_yield": True}, model="bge-m3", vram_gb=6,
                              priority="P2", est_s=est(60))
    first = procs.wait_running_on(task.id, "w1")
    wait_for(lambda: procs.redis.hget(procs.keys.task(task.id), "began_at"), 10,
             message="its handler to start, its model loaded")
    assert real_queue.requeue(task.id) is State.QUEUED
    again = wait_for(lambda: (r := procs.record(task.id)).state is State.RUNNING
                     and r.started_at != first.started_at and r, 10, message="claimed again")
    assert again.worker == "w1"
    wait_for(lambda: f"task.stopped task={task.id}" in procs.logs(), 15,
             message=lambda: f"the old run stopped; logs:\n{procs.logs()}")
    wait_for(lambda: value(scrape(worker_port)[1], "gpuq_worker_tasks_total", outcome="lost") == 1, 5,
             message=lambda: f"outcome lost; logs:\n{procs.logs()}")
    assert procs.record(task.id).state is State.RUNNING  # the new run goes on
