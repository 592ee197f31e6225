"""The simulator: determinism, the baselines behave as named, fidelity to real workers, CLI.

The replays here read a small synthetic trace in the GenAI trace's format, written by the
``trace_dir`` fixture, so they run wherever the shared traces are not
(tests/unit/test_traces.py covers the real files).
"""

from __future__ import annotations

import csv
import gzip
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from procs import Procs, est

from gpuq import Queue, State
from gpuq.config import Config
from gpuq.connection import connect
from gpuq.embedded import EmbeddedServer
from gpuq.keys import Keys
from gpuq.sim import traces
from gpuq.sim.model import TraceTask
from gpuq.sim.policies import GpuqScheduler
from gpuq.sim.report import summarize
from gpuq.sim.rounds import URGENT_REACTION_S
from gpuq.sim.run import parse_gpus, simulate

LOAD_S = 10.0


def fixed_load(model: str, rng: random.Random) -> float:
    return LOAD_S


def run(tasks: list[TraceTask], gpus: str, policy: str, server: EmbeddedServer,
        seed: int = 1) -> Any:
    return simulate(tasks, parse_gpus(gpus), policy, speedup=1.0, load_time=fixed_load, seed=seed,
                    server=server)


def task(t: float, model: str, priority: int, service: float = 5.0, vram: float = 20.0) -> TraceTask:
    return TraceTask(t, model, vram, priority, service, service, None, priority >= 2)


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    """A 400-request trace in the GenAI trace's columns (12 models, 8 tenants, bursts) and a
    load-latency file of measured-looking loads."""
    rng = random.Random(11)
    folder = tmp_path / "traces"
    folder.mkdir()
    columns = ["arrival_s", "model", "input_tokens", "output_tokens", "service_s", "task", "status",
               "tenant", "num_lora", "num_images", "num_steps", "prompt_chars"]
    with gzip.open(folder / traces.TRACES["genai"], "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        t = 0
        for _ in range(400):
            t += rng.choice([0, 0, 1, 5, 30, 120])
            w.writerow([t, f"M{rng.randint(0, 11):04d}", "", "", rng.randint(5, 60), "TXT_2_IMG",
                        "SUCCEED", f"G{rng.randint(0, 7):04d}", 0, 1, 30, 50])
    with gzip.open(folder / traces.LOAD_LATENCY_FILE, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "kind", "latency_s", "container"])
        for i in range(50):
            w.writerow([i, "base_model_load", round(rng.uniform(5, 45), 3), "c0"])
    return folder


def test_the_same_seed_gives_the_same_report(redis_server: EmbeddedServer, trace_dir: Path) -> None:
    tasks = traces.read("genai", trace_dir, limit=300, seed=3)
    loads = traces.LoadTimes.from_trace(trace_dir)
    reports, claims = [], []
    for _ in range(2):
        r = simulate(tasks, parse_gpus("2x80,1x48"), "gpuq", speedup=2000.0, load_time=loads.sample,
                     seed=7, server=redis_server)
        reports.append({k: v for k, v in summarize(r).items() if k != "wall_s"})
        claims.append(r.claims)
    assert reports[0] == reports[1] and claims[0] == claims[1]
    assert reports[0]["succeeded"] == 300 and reports[0]["model_loads"] > 12


def test_fifo_ignores_priority_and_priority_does_not(redis_server: EmbeddedServer) -> None:
    # one GPU busy with a first task, which may not be preempted, while three more arrive:
    # P3, then P2, then P0
    tasks = [replace(task(0, "m", 2), preemptible=False), task(1, "m", 3), task(2, "m", 2),
             task(3, "m", 0)]
    fifo = run(tasks, "1x80", "fifo", redis_server)
    assert fifo.claims == ["t000000", "t000001", "t000002", "t000003"]
    strict = run(tasks, "1x80", "priority", redis_server)
    assert strict.claims == ["t000000", "t000003", "t000002", "t000001"]
    assert run(tasks, "1x80", "gpuq", redis_server).claims == strict.claims


def test_priority_ignores_affinity_and_gpuq_does_not(redis_server: EmbeddedServer) -> None:
    # the GPU holds model a after the first task; an older task for b and a newer one for a
    # wait at the same priority: strict priority takes the head (b, a load), gpuq takes a
    tasks = [task(0, "a", 2, vram=40), task(1, "b", 2, vram=40), task(2, "a", 2, vram=40)]
    strict = run(tasks, "1x48", "priority", redis_server)
    assert strict.claims == ["t000000", "t000001", "t000002"] and strict.model_loads == 3
    ours = run(tasks, "1x48", "gpuq", redis_server)
    assert ours.claims == ["t000000", "t000002", "t000001"] and ours.model_loads == 2


def test_a_p0_arrival_preempts_long_batch_work(redis_server: EmbeddedServer) -> None:
    tasks = [task(0, "m", 3, service=600), task(30, "m", 0, service=1)]
    r = run(tasks, "1x80", "gpuq", redis_server)
    p0 = next(t for t in r.tasks if t.priority == 0)
    p3 = next(t for t in r.tasks if t.priority == 3)
    assert p0.start_s is not None and p0.start_s - p0.arrival_s <= 2.0  # one reaper round
    assert p3.preemptions == 1 and p3.outcome == "succeeded"
    assert p3.end_s is not None and p3.end_s == pytest.approx(LOAD_S + 600 + 1, abs=3)  # resumed
    assert r.preemptions["yielded"] == 1


def test_a_p0_is_not_left_waiting_for_a_natural_end_past_its_sla(redis_server: EmbeddedServer) -> None:
    # the P3 task is expected to end in 4 s (within max_wait): waiting for it would miss the
    # 200 ms SLA, so the reaper, woken by the P0's enqueue (not its next round at 16 s), asks
    # it to yield at once
    tasks = [task(0, "m", 3, service=20), task(15.9, "m", 0, service=1)]
    r = run(tasks, "1x80", "gpuq", redis_server)
    p0 = next(t for t in r.tasks if t.priority == 0)
    assert p0.start_s == pytest.approx(15.9 + URGENT_REACTION_S) and r.preemptions["yielded"] == 1
    assert summarize(r)["priorities"]["P0"]["sla_attainment"] == 1.0


# --- skip-ahead: the rounds and claims a replay skips change nothing -------------------------

# one 80 GB GPU, a victim asked after 5 s of running: a long P3 task is asked to yield for a
# P0 task once it has run 5 s (by the round after another arrival, not by the P0's urgent
# pass), then for another; then it
# may not be asked again (preempt_max), so the third P0 waits for its expected end (its
# estimate is short: reserved 30 s before it); meanwhile a P1 expires at the round after it
# comes (its deadline is shorter than its estimate), another when its deadline comes near,
# and a P2 with a far deadline runs at the end
PREEMPT_MAX = [replace(task(0, "b", 3, service=2000), est_s=1000), task(3, "a", 0, service=20),
               task(4.5, "c", 3, service=10), task(100, "a", 0, service=20), task(200, "a", 0, service=20),
               replace(task(250.5, "e", 1, service=10), est_s=4, deadline_s=5),
               replace(task(400, "d", 1, service=10), deadline_s=100),
               replace(task(410, "d", 2, service=10), deadline_s=100_000)]
def test_skipping_rounds_gives_the_same_replay(
        redis_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks, gpus, config = PREEMPT_MAX, "1x80", Config(preempt_min_runtime_s=5)
    calls = {"tick": 0, "claim": 0}

    def counting(name: str) -> Any:
        original = getattr(GpuqScheduler, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return original(*args, **kwargs)
        return counted

    for name in calls:
        monkeypatch.setattr(GpuqScheduler, name, counting(name))
    replays = []
    for skip in (False, True):
        calls.update(tick=0, claim=0)
        r = simulate(tasks, parse_gpus(gpus), "gpuq", speedup=1.0, load_time=fixed_load,
                     config=config, server=redis_server, skip_ahead=skip)
        tasks_seen = [(t.id, t.start_s, t.end_s, t.outcome, t.preemptions, t.worker) for t in r.tasks]
        replays.append(({k: v for k, v in summarize(r).items() if k != "wall_s"}, tasks_seen, r.claims,
                        dict(calls)))
    (every, *every_run, every_calls), (skipped, *skipped_run, skipped_calls) = replays
    assert skipped == every and skipped_run == every_run
    assert every["succeeded"] == len(tasks) - every["priorities"]["P1"]["expired"]
    assert every["preemptions"]["yielded"] >= 1
    # the replay without skipping ran many idle rounds: those were skipped (not the rounds
    # that reserve the GPU again, every few seconds, while the long task overruns its estimate)
    assert skipped_calls["tick"] + skipped_calls["claim"] < (every_calls["tick"] + every_calls["claim"]) / 5


def test_a_held_models_task_evicts_the_gpus_other_idle_model(redis_server: EmbeddedServer) -> None:
    # a 24 GB GPU (19 GB usable) holds model a (7 GB) and runs a 5 GB P3 task of model b when
    # a 16 GB P0 task of a comes; the 48 GB GPU runs non-preemptible work until 400 s. The P3
    # task yields, and the P0 task starts there at once: its 9 GB beyond a's weights fit in
    # the 7 GB free plus b's 5, b evicted (a claim counting free VRAM only left the GPU
    # reserved and idle until 400 s, while a P0 task of a and a GPU holding a waited)
    tasks = [replace(task(0, "x", 2, service=400.1, vram=30), preemptible=False),
             task(1, "a", 0, service=5, vram=7), task(20, "b", 3, service=3000, vram=5),
             task(100, "a", 0, service=50, vram=16)]
    r = run(tasks, "1x24,1x48", "gpuq", redis_server)
    p0 = r.tasks[3]
    assert (p0.model, p0.priority, p0.worker, p0.cold_start) == ("a", 0, "gpu24-0", False)
    assert p0.exec_s == p0.start_s
    assert p0.start_s is not None and p0.start_s < 101
    p3 = r.tasks[2]  # resumed once the P0 task ended, b loaded again
    assert (p3.preemptions, p3.outcome, p3.worker) == (1, "succeeded", "gpu24-0")
    assert p3.end_s is not None and p3.end_s < 3000 + 150 + LOAD_S


def test_every_gpu_claims_once_on_start_and_is_then_idle(redis_server: EmbeddedServer) -> None:
    # as a real worker does: enqueue wakes only workers in the idle set
    run([], "2x80", "gpuq", redis_server)
    client = connect(redis_server.url)
    try:
        assert sorted(client.zrange(Keys("sim", "gpuq").idle, 0, -1)) == ["gpu80-0", "gpu80-1"]
    finally:
        client.close()


def test_report_splits_busy_into_loading_and_running(redis_server: EmbeddedServer) -> None:
    # one cold task: 10 s loading, then 5 s running, on one GPU over a 15 s makespan
    r = summarize(run([task(0, "m", 2, service=5)], "1x80", "gpuq", redis_server))
    split = (r["gpu_busy_fraction"], r["gpu_loading_fraction"], r["gpu_running_fraction"])
    assert split == (1.0, 0.6667, 0.3333)
    assert r["priorities"]["P2"]["cold_starts"] == 1


def test_a_task_claimed_at_once_that_waits_for_its_model_misses_its_sla(
        redis_server: EmbeddedServer) -> None:
    # two P0 tasks of one model on an idle GPU: both claimed on arrival, the first waits for
    # the model's 10 s load before its handler starts (a miss), the second finds it loaded
    r = run([task(0, "m", 0), task(20, "m", 0)], "1x80", "gpuq", redis_server)
    cold, warm = r.tasks
    assert (cold.start_s, cold.exec_s, cold.load_wait_s, cold.cold_start) == (0.0, LOAD_S, LOAD_S, True)
    assert (warm.start_s, warm.exec_s, warm.cold_start) == (20.0, 20.0, False)
    p0 = summarize(r)["priorities"]["P0"]
    assert (p0["sla_attainment"], p0["claim_sla_attainment"]) == (0.5, 1.0)
    assert (p0["cold_starts"], p0["load_wait_p50_s"], p0["wait_p99_s"]) == (1, LOAD_S, LOAD_S)


# --- fidelity: the same claims as real worker processes ------------------------------------

SCENARIO = [(m, p) for m, p in (("a", 3), ("b", 0), ("a", 2), ("c", 1), ("b", 2), ("a", 0),
                                ("c", 3), ("b", 1), ("a", 1), ("c", 0), ("b", 3), ("a", 2),
                                ("c", 2), ("b", 0), ("a", 3), ("c", 1))]


@pytest.mark.slow
def test_simulated_claim_order_equals_a_real_workers(procs: Procs, real_queue: Queue,
                                                     redis_server: EmbeddedServer) -> None:
    """One 48 GB GPU (two 20 GB models fit, a third evicts), sixteen tasks queued at once.
    Nothing is preemptible, so no reaper decision (which real time would place at random
    between claims) can come in between: the order is the claim script's alone."""
    worker = procs.worker("w1", vram_gb=48)
    ids = [f"t{i:06d}" for i in range(len(SCENARIO))]
    real_queue.enqueue_many([{"handler": "sim.run", "payload": {}, "model": m, "vram_gb": 20,
                              "priority": p, "est_s": est(0.02), "task_id": tid,
                              "preemptible": False}
                             for tid, (m, p) in zip(ids, SCENARIO)])
    records = procs.wait_all(ids, State.SUCCEEDED, timeout=60)
    real = [r.id for r in sorted(records, key=lambda r: r.token or 0)]
    assert worker.alive()
    tasks = [TraceTask(0, m, 20, p, 1.0, 1.0, None, False) for m, p in SCENARIO]
    simulated = run(tasks, "1x48", "gpuq", redis_server).claims
    assert simulated == real, f"simulated {simulated}\nreal      {real}"


# --- the command -----------------------------------------------------------------------------

def test_cli_json_report(procs: Procs, trace_dir: Path) -> None:
    out = procs.cli("simulate", "--trace", "genai", "--traces-dir", str(trace_dir), "--limit", "150",
                    "--gpus", "2x80",
                    "--speedup", "3000", "--policy", "gpuq", "--json",
                    env={"GPUQ_REAP_INTERVAL_S": "1"})  # the suite's processes reap faster
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["policy"] == "gpuq" and report["speedup"] == 3000
    assert set(report["priorities"]) == {"P0", "P1", "P2", "P3"}
    for p in report["priorities"].values():
        assert {"tasks", "sla_attainment", "wait_p50_s", "wait_p99_s", "expired"} <= set(p)
    assert {"gpu_busy_fraction", "model_loads", "preemptions", "starved", "throughput_per_s",
            "makespan_s"} <= set(report)
    assert sum(p["tasks"] for p in report["priorities"].values()) == 150


def test_cli_text_report_says_what_ran(procs: Procs, trace_dir: Path) -> None:
    """Found by a QA pass: the text report never said the speedup the default chose."""
    base = ["simulate", "--trace", "genai", "--traces-dir", str(trace_dir), "--limit", "100",
            "--gpus", "2x80,1x48", "--policy", "fifo"]
    first = procs.cli(*base).stdout.splitlines()[0]
    assert first.startswith("trace genai: 100 tasks on 3 workers (2x80, 1x48 GB), arrivals sped up ")
    assert first.endswith("x (chosen for an offered load of 0.8)")
    given = procs.cli(*base, "--speedup", "3000").stdout.splitlines()[0]
    assert given.endswith("arrivals sped up 3000x")


@pytest.mark.parametrize("args, message", [
    (["--gpus", "4 by 80"], "--gpus '4 by 80': use COUNTx[GPUSx]GB"),
    (["--trace", "nope"], "unknown trace 'nope'"),
    (["--speedup", "2", "--target-load", "0.5"], "not both"),
    (["--speedup", "0"], "--speedup must be a finite number > 0"),
])
def test_cli_bad_options_give_one_error_line(procs: Procs, trace_dir: Path, args: list[str],
                                            message: str) -> None:
    out = procs.cli("simulate", "--traces-dir", str(trace_dir), "--limit", "10", "--policy", "fifo", *args)
    assert out.returncode == 2  # bad input
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0], out.stderr


def test_find_gpus_gives_the_smallest_pool_that_meets_the_target(procs: Procs, trace_dir: Path) -> None:
    # P2 (5 min): at this compression a P0 or P1 task that waits for any load (5-45 s) misses
    out = procs.cli("simulate", "--trace", "genai", "--traces-dir", str(trace_dir), "--limit", "120",
                    "--gpus", "1x80", "--sla-priority", "P2",
                    "--speedup", "4000", "--find-gpus", "--sla-target", "0.9", "--json",
                    env={"GPUQ_REAP_INTERVAL_S": "1"}, timeout=120)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    n, tried = found["gpus"], {int(k): v for k, v in found["tried"].items()}
    assert n is not None and tried[n] >= 0.9
    assert n == 1 or tried[n - 1] < 0.9  # one GPU fewer misses it
    assert found["report"]["priorities"]["P2"]["sla_attainment"] == tried[n]


def test_find_gpus_refuses_a_target_first_loads_rule_out(procs: Procs, trace_dir: Path) -> None:
    # every replay starts with no model loaded: each model's first P0 request misses 200 ms
    out = procs.cli("simulate", "--traces-dir", str(trace_dir), "--limit", "120", "--gpus", "1x80",
                    "--find-gpus", "--sla-target", "0.999")
    assert out.returncode == 2 and "cannot be met at P0 by any pool" in out.stderr, out.stderr


def test_find_gpus_needs_one_kind(procs: Procs, trace_dir: Path) -> None:
    out = procs.cli("simulate", "--traces-dir", str(trace_dir), "--limit", "10", "--gpus", "1x80,1x48",
                    "--find-gpus")
    assert out.returncode == 2 and "--find-gpus needs one GPU kind" in out.stderr


def test_a_victim_coming_of_age_between_rounds_is_asked_then(redis_server: EmbeddedServer) -> None:
    # a P0 task comes 0.5 s after a P3 task started on the only GPU: the urgent pass finds
    # the victim too young (0.7 s minimum) and says when it comes of age; the reaper plans
    # again then, not at the next round (1 s)
    # (loads take no time here: a victim still loading yields only when its load ends)
    tasks = [task(0, "b", 3, service=100, vram=40), task(0.5, "a", 0, service=5, vram=40)]
    r = simulate(tasks, parse_gpus("1x80"), "gpuq", speedup=1.0, load_time=lambda m, rng: 0.0,
                 config=Config(preempt_min_runtime_s=0.7), server=redis_server)
    p3, p0 = r.tasks
    assert p0.worker == "gpu80-0" and p0.start_s == pytest.approx(0.7, abs=0.002)
    assert p3.preemptions == 1 and p3.outcome == "succeeded"


ASKED_AT = 0.5 + URGENT_REACTION_S  # the P0 task's urgent pass


# a yielding victim's handler started when its load ended; a stopped one's only on its next
# run, after the P0 task's load and run and its own second load
@pytest.mark.parametrize(("grace_s", "how", "gives_way_at", "victim_starts"), [
    (30.0, "yielded", LOAD_S, LOAD_S),
    (2.0, "stopped", ASKED_AT + 2.0, ASKED_AT + 2.0 + LOAD_S + 5 + LOAD_S)])
def test_a_victim_asked_while_it_loads_gives_way_when_the_load_ends_or_the_grace_does(
        redis_server: EmbeddedServer, grace_s: float, how: str, gives_way_at: float,
        victim_starts: float) -> None:
    # the P3 task loads its model for 10 s and, with no minimum runtime, is asked to yield
    # at once; its handler sees the request when the load ends, unless the worker stopped it
    # at the grace first
    tasks = [task(0, "b", 3, service=100, vram=40), task(0.5, "a", 0, service=5, vram=40)]
    r = simulate(tasks, parse_gpus("1x80"), "gpuq", speedup=1.0, load_time=fixed_load,
                 config=Config(preempt_min_runtime_s=0.0, grace_s=grace_s), server=redis_server)
    p3, p0 = r.tasks
    assert p0.start_s == pytest.approx(gives_way_at, abs=0.002)
    assert p3.preemptions == 1 and p3.outcome == "succeeded"
    assert r.preemptions.get(how) == 1 and r.preemptions.get("yield_requested") == 1
    assert p3.exec_s == pytest.approx(victim_starts, abs=0.002)
    assert (p3.cold_start, p3.load_wait_s) == (True, pytest.approx(LOAD_S))


@pytest.mark.parametrize("skip", [True, False])
def test_a_victim_loading_a_model_never_loaded_before_is_not_asked_until_it_runs(
        redis_server: EmbeddedServer, skip: bool) -> None:
    # "b" has no load time in the catalog yet: the P3 task's load counts as not begun until
    # the GPU reports its handler's start (began, at 10 s), so the P0 at 0.5 s waits for that
    # plus the minimum runtime, instead of throwing the load away
    tasks = [task(0, "b", 3, service=100, vram=40), task(0.5, "a", 0, service=5, vram=40)]
    r = simulate(tasks, parse_gpus("1x80"), "gpuq", speedup=1.0, load_time=fixed_load,
                 config=Config(preempt_min_runtime_s=0.7), server=redis_server, skip_ahead=skip)
    p3, p0 = r.tasks
    assert p0.start_s == pytest.approx(LOAD_S + 0.7, abs=0.01)
    assert r.preemptions.get("yielded") == 1 and r.preemptions.get("stopped", 0) == 0
    assert p3.exec_s == pytest.approx(LOAD_S) and p3.outcome == "succeeded"


@pytest.mark.parametrize("skip", [True, False])
def test_a_victim_loading_a_model_of_known_load_time_is_not_asked_until_it_runs(
        redis_server: EmbeddedServer, skip: bool) -> None:
    # "b" was loaded once (10 s) and evicted; the long P3 task loads it again from 30 s: the
    # claim notes its expected load end (40 s) and the P0 at 31 s waits for that, plus the
    # minimum runtime, instead of throwing the load away
    tasks = [task(0, "b", 2, service=5, vram=60), task(15, "c", 2, service=5, vram=60),
             task(30, "b", 3, service=100, vram=40), task(31, "a", 0, service=5, vram=40)]
    r = simulate(tasks, parse_gpus("1x80"), "gpuq", speedup=1.0, load_time=fixed_load,
                 config=Config(preempt_min_runtime_s=0.7), server=redis_server, skip_ahead=skip)
    p3, p0 = r.tasks[2], r.tasks[3]
    assert p3.start_s == pytest.approx(30, abs=0.01)
    assert p0.start_s == pytest.approx(30 + LOAD_S + 0.7, abs=0.01)
    assert r.preemptions.get("yielded") == 1 and r.preemptions.get("stopped", 0) == 0
