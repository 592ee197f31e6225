"""Simulator pieces without a server: the --gpus spec, the compression for a target load, and
the report's arithmetic."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuq.errors import ConfigError
from gpuq.sim.model import SimResult, SimTask, TraceTask
from gpuq.sim.report import heading, render, render_split, summarize
from gpuq.sim.run import parse_gpus, speedup_for


def test_gpus_spec_counts_sizes_and_lanes() -> None:
    assert parse_gpus("2x80,1x48") == [("gpu80-0", 80.0), ("gpu80-1", 80.0), ("gpu48-0", 48.0)]
    assert parse_gpus("1x80, 2X24/10") == [("gpu80-0", 80.0), ("gpu24-0@01", 24.0), ("gpu24-1@01", 24.0)]
    # a lane and a plain group of the same size get distinct ids
    ids = [w for w, _ in parse_gpus("1x80,1x80/0,1x80")]
    assert len(set(ids)) == 3


@pytest.mark.parametrize("spec", ["", "4 by 80", "0x80", "2x0", "2x80/4", "x80"])
def test_bad_gpus_spec_is_a_config_error(spec: str) -> None:
    with pytest.raises(ConfigError, match="--gpus"):
        parse_gpus(spec)


def test_speedup_makes_offered_work_the_target_share_of_the_pool() -> None:
    tasks = [TraceTask(t, "m", 10, 2, 50.0, 50.0) for t in (0.0, 500.0, 1000.0)]
    # 150 GPU-seconds of work over 1,000 s on 2 GPUs: load 0.075 uncompressed
    k = speedup_for(tasks, 2, 0.6)
    assert k == pytest.approx(8.0)
    assert speedup_for(tasks[:1], 2, 0.6) == 1.0  # no span to compress


def task(tid: str, priority: int, arrival: float, start: float | None, end: float | None,
         outcome: str, load: float = 0.0) -> SimTask:
    """A task claimed at ``start`` whose handler started ``load`` seconds later."""
    return SimTask(tid, priority, "m", 10, arrival, 1.0, 1.0, start_s=start,
                   exec_s=None if start is None else start + load, load_wait_s=load,
                   cold_start=load > 0, end_s=end, outcome=outcome,
                   worker="g" if start is not None else None)


def test_the_plots_wait_curve_is_a_share_of_all_the_levels_tasks() -> None:
    """Found by a capacity planner: the --plot curves were shares of the tasks that started,
    so gpuq's P2 curve read 0.45 at the SLA line where the report said 36.5% (12 of 63
    expired), flattering it against baselines that expire nothing."""
    from gpuq.sim.plot import wait_cdf

    tasks = [task("a", 2, 0.0, 1.0, 2.0, "succeeded"), task("b", 2, 0.0, 3.0, 4.0, "succeeded"),
             task("c", 2, 0.0, None, None, "expired"), task("d", 0, 0.0, 0.0, 1.0, "succeeded")]
    result = SimResult("gpuq", 1.0, [("g", 24.0)], [0.2, 1.0, 300.0, None], tasks,
                       busy_s={"g": 4.0}, model_loads=1, makespan_s=4.0)
    assert wait_cdf(result, 2) == ([1.0, 3.0], [1 / 3, 2 / 3])
    assert wait_cdf(result, 0) == ([1e-3], [1.0]) and wait_cdf(result, 1) == ([], [])


def test_report_counts_never_started_tasks_as_sla_misses() -> None:
    tasks = [task("a", 0, 0.0, 0.1, 1.1, "succeeded"),   # 100 ms: within 200 ms
             task("b", 0, 0.0, 0.5, 1.5, "succeeded"),   # 500 ms: missed
             task("c", 0, 0.0, None, 9.0, "expired"),     # never started: missed
             task("d", 3, 0.0, 5.0, 6.0, "succeeded"),
             task("e", 3, 0.0, None, None, "unfinished")]
    result = SimResult("gpuq", 2.0, [("g", 80.0)], [0.2, 1.0, 300.0, None], tasks,
                       busy_s={"g": 4.0}, model_loads=1, preemptions={"yielded": 2}, makespan_s=10.0)
    r = summarize(result)
    p0 = r["priorities"]["P0"]
    assert (p0["tasks"], p0["sla_attainment"], p0["expired"]) == (3, round(1 / 3, 4), 1)
    assert p0["wait_p50_s"] == 0.5 and r["priorities"]["P3"]["sla_attainment"] is None
    assert r["starved"] == 1 and r["succeeded"] == 3
    assert r["gpu_busy_fraction"] == 0.4 and r["throughput_per_s"] == 0.3
    assert r["preemptions"] == {"reserved": 0, "yield_requested": 0, "yielded": 2, "stopped": 0}
    text = render([r])
    assert "33.3%" in text and "P1" in text and all(len(line) <= 100 for line in text.splitlines())


def test_the_sla_is_met_when_the_handler_starts_not_when_the_task_is_claimed() -> None:
    # both P0 tasks are claimed at once; one waits 20 s for its model: a miss
    tasks = [task("a", 0, 0.0, 0.0, 1.0, "succeeded"),
             task("b", 0, 0.0, 0.0, 21.0, "succeeded", load=20.0),
             task("c", 1, 0.0, 0.5, 31.0, "succeeded", load=30.0),
             task("d", 1, 0.0, 0.5, 2.0, "succeeded", load=0.25),
             task("e", 1, 0.0, 0.5, 2.0, "succeeded")]
    result = SimResult("gpuq", 1.0, [("g", 80.0)], [0.2, 1.0, 300.0, None], tasks,
                       busy_s={"g": 50.0}, model_loads=3, makespan_s=31.0)
    r = summarize(result)
    p0, p1 = r["priorities"]["P0"], r["priorities"]["P1"]
    assert (p0["sla_attainment"], p0["claim_sla_attainment"]) == (0.5, 1.0)
    assert (p0["wait_p99_s"], p0["claim_wait_p99_s"], p0["cold_starts"]) == (20.0, 0.0, 1)
    assert (p0["load_wait_p50_s"], p0["load_wait_p99_s"]) == (20.0, 20.0)
    assert (p1["sla_attainment"], p1["claim_sla_attainment"], p1["cold_starts"]) == (0.6667, 1.0, 2)
    # over the cold starts only (the warm task's zero would make the median 0.25)
    assert p1["load_wait_p50_s"] == 30.0 and p1["load_wait_p99_s"] == 30.0
    assert r["priorities"]["P2"]["load_wait_p50_s"] is None  # no cold start
    rows = {tuple(line.split()[:2]): line.split() for line in render([r]).splitlines() if line}
    assert rows[("gpuq", "P0")][4:6] == ["50.0%", "100.0%"]


def test_report_compares_loads_with_the_offline_references() -> None:
    # one 15 GB GPU (10 GB usable) for two 5 GB models and a third: a b c a b
    tasks = [replace(task(f"t{i}", 0 if i < 2 else 2, float(i), float(i), i + 1.0, "succeeded"),
                     model=m, vram_gb=5) for i, m in enumerate("abcab")]
    result = SimResult("fifo", 1.0, [("g", 15.0)], [0.2, 1.0, 300.0, None], tasks,
                       busy_s={"g": 5.0}, model_loads=5, makespan_s=5.0, kv_reserve_gb=5.0)
    r = summarize(result)
    # Belady evicts a or b for c: 4 loads; LRU evicts a, then b for a, then c for b: 5
    assert r["reference"] == {"rule": "belady", "usable_gb": 10.0, "loads": 4,
                              "cold_starts": {"P0": 2, "P1": 0, "P2": 2, "P3": 0}}
    assert r["reference_lru"]["loads"] == 5
    assert r["vs_reference"] == {"model_loads": 1.25, "cold_starts_p0": 0.0}
    rows = [line.split() for line in render([r]).splitlines()[-3:]]
    assert rows == [["fifo", "5", "1.25x", "0", "0.00x", "0", "0", "0"],
                    ["ref", "belady", "4", "1.00x", "2", "1.00x", "0", "2", "0"],
                    ["ref", "lru", "5", "1.25x", "2", "1.00x", "0", "3", "0"]]


def test_tasks_refused_up_front_are_named_under_the_tables() -> None:
    tasks = [task("a", 0, 0.0, 0.1, 1.1, "succeeded")]
    result = SimResult("gpuq", 1.0, [("g", 24.0)], [0.2, 1.0, 300.0, None], tasks,
                       busy_s={"g": 1.0}, model_loads=1, makespan_s=1.1)
    assert "refused" not in render([summarize(result)])
    result.rejected = 2
    said = render([summarize(result)]).splitlines()[-3:]
    assert said[0].startswith("2 task(s) refused up front") and "or GPUs" in said[1]
    assert said[2] == "past their tenant's caps"
    assert max(map(len, said)) <= 100


def test_table_keeps_columns_apart_for_waits_of_days() -> None:
    # an openb-like replay: P0 waits of weeks
    tasks = [task("a", 0, 0.0, 1512025.85, 1512100.0, "succeeded"),
             task("b", 0, 0.0, 5883873.0, 5883900.0, "succeeded"),
             task("c", 2, 0.0, 12.5, 20.0, "succeeded"),
             task("d", 3, 0.0, 4000.0, 4100.0, "succeeded")]
    result = SimResult("gpuq", 1.0, [("g", 80.0)], [0.2, 1.0, 300.0, None], tasks,
                       busy_s={"g": 100.0}, model_loads=0, preemptions={}, makespan_s=5883900.0)
    report = summarize(result)
    rows = render([report]).splitlines()
    waits = {r.split()[1]: r.split()[6:8] for r in rows[1:5]}
    assert rows[1].split() == ["gpuq", "P0", "2", "0.2s", "0.0%", "0.0%", "68.1d", "68.1d", "0", "-", "-",
                               "0"]
    assert waits["P2"] == ["12.50s", "12.50s"] and waits["P3"] == ["66.7min", "66.7min"]
    assert report["priorities"]["P0"]["wait_p50_s"] == 5883873.0  # the JSON keeps seconds


def test_split_tables_keep_columns_apart_for_long_waits() -> None:
    """The 70B and tenant tables print waits as the main table does (27358.90s131095.38s
    ran together before)."""
    part = {"tasks": 1105, "wait_p50_s": 27358.9, "wait_p99_s": 131095.38, "sla_attainment": 0.0}
    rows = render_split([{"policy": "fifo", "by_size": {"70b": part}}], "by_size", "MODELS").splitlines()
    assert rows[1].split() == ["fifo", "70b", "1105", "7.6h", "36.4h", "0.0%"]


def test_the_heading_shows_groups_and_lanes_and_warns_of_levels_no_worker_serves() -> None:
    """Found by a QA pass: `--gpus 2x4x80` and `--gpus 2x320` both read "2 workers (2x320
    GB)", a lane pool's heading left its lanes out, and a pool of P0/P1 lanes replayed every
    P2/P3 task as starved without a word (the baselines, which ignore lanes, served them)."""
    tasks = [task("a", 0, 0.0, 0.1, 1.1, "succeeded")]

    def heading_of(spec: str) -> str:
        result = SimResult("gpuq", 1.0, parse_gpus(spec), [0.2, 1.0, 300.0, None], tasks, makespan_s=1.1)
        return heading({**summarize(result), "trace": "t"}, None)

    assert "2 workers (2x4x80 GB)" in heading_of("2x4x80")
    assert "3 workers (1x80, 2x24/01 GB)" in heading_of("1x80,2x24/10")
    assert "serves" not in heading_of("1x80,2x24/10")
    assert heading_of("2x80/01").endswith("; no worker serves P2, P3: their tasks never start under "
                                          "gpuq (the baselines ignore lanes)")


def test_the_references_keep_a_group_s_reserve_on_each_of_its_gpus() -> None:
    """Found by a QA pass: a 4x80 group's usable VRAM was counted as 315 GB (one 5 GB reserve),
    where its worker keeps 300 (one per GPU)."""
    tasks = [replace(task("a", 0, 0.0, 0.1, 1.1, "succeeded"), vram_gb=10)]
    result = SimResult("gpuq", 1.0, parse_gpus("1x4x80,1x80"), [0.2, 1.0, 300.0, None], tasks,
                       makespan_s=1.1, kv_reserve_gb=5.0)
    assert summarize(result)["reference"]["usable_gb"] == 375.0
