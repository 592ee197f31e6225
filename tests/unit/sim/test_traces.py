"""The trace readers against the real shared trace files: counts, mappings, determinism, errors."""

from __future__ import annotations

import functools
import os
import random
import statistics
from collections import Counter
from pathlib import Path

import pytest

import gpuq
from gpuq.sim import traces
from gpuq.sim.model import TraceTask
from gpuq.sim.traces import LoadTimes, read, read_trace
from gpuq.sim.traces_llm import CARD_GB, CLASS_13B, CLASS_70B, session_roots

# the shared traces: $GPUQ_TRACES when the suite starts (CI sets it where the checkout has no
# ../shared), else the default next to the checkout
SHARED = Path(os.environ.get(traces.ENV_VAR) or traces.DEFAULT_DIR)
pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not found at {SHARED}")

# name -> (rows in the file, tasks read, skipped rows by reason)
EXPECTED = {
    "genai": (15_630, 15_615, {"pending": 15}),
    "openb": (8_152, 6_129, {"cpu only": 1_088, "multi-gpu": 75, "never scheduled": 860}),
    "azure": (28_185, 28_185, {}),
    "mooncake": (12_031, 12_031, {}),
}


@pytest.fixture(autouse=True)
def _shared_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(traces.ENV_VAR, str(SHARED))


@functools.cache
def cached(name: str, seed: int = 1) -> traces.TraceRead:
    return read_trace(name, SHARED, seed=seed)


def task(arrival_s: float, service_s: float) -> TraceTask:
    return TraceTask(arrival_s=arrival_s, model="m", vram_gb=1.0, priority=0, service_s=service_s,
                     est_s=service_s)


@pytest.mark.parametrize("name", sorted(traces.TRACES))
def test_reader_counts_rows_tasks_and_skips(name: str) -> None:
    got = cached(name)
    assert (got.rows, len(got.tasks), got.skipped) == EXPECTED[name]
    assert got.rows == len(got.tasks) + sum(got.skipped.values())


@pytest.mark.parametrize("name", sorted(traces.TRACES))
def test_reader_returns_sorted_sane_tasks(name: str) -> None:
    tasks = cached(name).tasks
    arrivals = [t.arrival_s for t in tasks]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0
    for t in tasks:
        assert t.priority in range(4)
        assert 0 < t.vram_gb <= CARD_GB
        assert t.service_s > 0 and t.est_s > 0
        assert t.preemptible == (t.priority >= 2)
        assert t.deadline_s is None
        assert t.model and t.tenant


def test_default_directory_is_shared_traces_beside_the_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = Path(gpuq.__file__).resolve().parents[2] / "shared" / "traces"
    assert traces.DEFAULT_DIR == expected
    monkeypatch.delenv(traces.ENV_VAR)
    if expected.is_dir():  # a clone elsewhere (CI) has no shared folder beside it
        assert traces.trace_dir() == expected
    else:
        with pytest.raises(FileNotFoundError, match=str(expected)):
            traces.trace_dir()


def test_genai_vram_and_estimate_are_per_model() -> None:
    tasks = cached("genai").tasks
    by_model: dict[str, list[TraceTask]] = {}
    for t in tasks:
        by_model.setdefault(t.model, []).append(t)
    assert len(by_model) == 77
    for model, group in by_model.items():
        assert {t.vram_gb for t in group} == {traces.sd_vram_gb(model, 1)}
        assert {t.est_s for t in group} == {group[0].est_s}
        assert group[0].est_s == pytest.approx(statistics.fmean(t.service_s for t in group))
    assert all(8 <= t.vram_gb <= 40 for t in tasks)


def test_sd_vram_draws_match_the_pod_memory_quantiles() -> None:
    draws = sorted(traces.sd_vram_gb(f"M{i:05d}", 1) for i in range(4000))
    assert statistics.median(draws) == pytest.approx(24.8, abs=0.8)
    assert draws[int(0.99 * len(draws))] == pytest.approx(39.6, abs=1.0)
    assert traces.sd_vram_gb("M0000", 1) == traces.sd_vram_gb("M0000", 1)
    assert any(traces.sd_vram_gb(f"M{i}", 1) != traces.sd_vram_gb(f"M{i}", 2) for i in range(10))


def test_genai_priority_is_per_tenant_and_seeded() -> None:
    one, again, other = cached("genai").tasks, read("genai", seed=1), cached("genai", seed=2).tasks
    assert one == again
    tiers: dict[str, set[int]] = {}
    for t in one:
        tiers.setdefault(t.tenant, set()).add(t.priority)
    assert all(len(p) == 1 for p in tiers.values())
    assert [t.priority for t in one] != [t.priority for t in other]
    assert [t.service_s for t in one] == [t.service_s for t in other]


def test_tier_shares_follow_the_documented_split() -> None:
    counts = Counter(traces.tier(f"tenant-{i}", 7) for i in range(40_000))
    for priority, share in enumerate(traces.TIER_SHARES):
        assert counts[priority] / 40_000 == pytest.approx(share, abs=0.01)
    assert traces.tier("G0264", 1) == traces.tier("G0264", 1)


def test_openb_maps_columns() -> None:
    tasks = cached("openb").tasks
    assert {t.model for t in tasks} == {"openb-ls", "openb-guaranteed", "openb-burstable", "openb-be"}
    by_model = {t.model: t.priority for t in tasks}
    assert by_model == {"openb-ls": 0, "openb-guaranteed": 1, "openb-burstable": 2, "openb-be": 3}
    assert all(1.0 <= t.vram_gb <= 16.0 and t.est_s == t.service_s for t in tasks)
    first = tasks[1]  # openb-pod-0001: LS, one GPU at 0.46 -> 7.36 GB
    assert (first.arrival_s, first.vram_gb, first.service_s, first.priority) == (0.0, 7.36, 2963360.0, 0)


def test_llm_cost_model_numbers() -> None:
    assert CLASS_70B.service_s(374, 44) == pytest.approx(374 * 0.25e-3 + 44 * 30e-3)  # 1.4135 s
    assert CLASS_70B.vram_gb(374, 44) == 40.14  # 40 + 0.33 MB x 418 tokens
    assert CLASS_13B.service_s(4808, 10) == pytest.approx(0.38848)  # 4808 x 0.06 ms + 10 x 10 ms
    assert CLASS_13B.vram_gb(4808, 10) == 29.95  # 26 + 0.82 MB x 4818 tokens
    assert CLASS_70B.vram_gb(200_000, 0) == CARD_GB


def test_azure_rows_follow_the_cost_model() -> None:
    tasks = cached("azure").tasks
    conv = tasks[0]  # first row: azure-conv, 374 in, 44 out
    assert (conv.model, conv.priority, conv.tenant, conv.vram_gb) == ("azure-conv", 1, "azure-conv", 40.14)
    assert conv.service_s == conv.est_s == pytest.approx(1.4135)
    code = next(t for t in tasks if t.model == "azure-code")  # arrival 77.29937: 4808 in, 10 out
    assert (code.arrival_s, code.priority, code.vram_gb) == (77.29937, 0, 29.95)
    assert code.service_s == pytest.approx(0.38848)
    assert Counter(t.model for t in tasks) == {"azure-conv": 19_366, "azure-code": 8_819}


def test_mooncake_sessions_follow_real_reuse() -> None:
    rows = [{"parent_req": "-1", "reused_blocks": "0"}, {"parent_req": "0", "reused_blocks": "1"},
            {"parent_req": "1", "reused_blocks": "3"}, {"parent_req": "2", "reused_blocks": "4"}]
    assert session_roots(rows) == [0, 1, 1, 1]
    tasks = cached("mooncake").tasks
    assert tasks[0].service_s == pytest.approx(6758 * 0.25e-3 + 500 * 30e-3)  # 16.6895 s
    assert tasks[0].vram_gb == 42.4
    assert tasks[133].tenant == tasks[66].tenant  # row 133 reuses 5 blocks of row 66
    assert tasks[1].tenant == "session-1"  # reuses only the shared block 0: a session of its own
    assert len({t.tenant for t in tasks}) == 7_373
    assert max(t.vram_gb for t in tasks) == CARD_GB
    tiers: dict[str, set[int]] = {}
    for t in tasks:
        tiers.setdefault(t.tenant, set()).add(t.priority)
    assert all(len(p) == 1 for p in tiers.values())
    assert read("mooncake", seed=1) == tasks


def test_limit_keeps_the_first_tasks() -> None:
    assert read("genai", limit=10) == cached("genai").tasks[:10]
    assert read("openb", limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        read("genai", limit=-1)


def test_unknown_trace_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown trace 'nope'; known traces: azure, genai, mooncake, openb"):
        read("nope")


def test_missing_directory_names_the_path_and_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "absent"
    with pytest.raises(FileNotFoundError, match=f"{missing}.*GPUQ_TRACES"):
        read("genai", missing)
    monkeypatch.setenv("GPUQ_TRACES", str(missing))
    with pytest.raises(FileNotFoundError, match=f"{missing}.*GPUQ_TRACES"):
        read("genai")
    monkeypatch.setenv("GPUQ_TRACES", str(tmp_path))  # exists, but holds no trace
    with pytest.raises(FileNotFoundError, match="alibaba_genai2026_sd_requests.csv.gz.*GPUQ_TRACES"):
        read("genai")


def test_environment_variable_and_file_path_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUQ_TRACES", str(SHARED))
    assert read("openb", limit=5) == cached("openb").tasks[:5]
    file = SHARED / traces.TRACES["openb"]
    assert read_trace("openb", file, limit=5).path == file


def test_offered_work_and_span() -> None:
    tasks = [task(arrival_s=5.0, service_s=2.0), task(arrival_s=1.0, service_s=3.5)]
    assert traces.offered_gpu_seconds(tasks) == 5.5
    assert traces.span_s(tasks) == 4.0
    assert traces.span_s(tasks[:1]) == 0.0 and traces.offered_gpu_seconds([]) == 0.0


def test_load_times_sample_the_base_model_loads() -> None:
    loads = LoadTimes.from_trace()
    assert len(loads.samples) == 7_531
    assert min(loads.samples) == 1.329 and max(loads.samples) == 79.436
    draws = [loads.sample("M0000", random.Random(3)) for _ in range(3)]
    assert draws[0] == draws[1] == draws[2]
    rng = random.Random(5)
    many = [loads.sample("M0000", rng) for _ in range(2_000)]
    assert all(1.329 <= s <= 79.436 for s in many)
    assert statistics.fmean(many) == pytest.approx(loads.mean_s(), rel=0.05)
    assert loads.mean_s() == pytest.approx(21.99, abs=0.01)
    assert loads.mean_s("azure-conv") == pytest.approx(2 * loads.mean_s())  # 70B class
    assert loads.mean_s("azure-code") == pytest.approx(1.5 * loads.mean_s())  # 13B class
    first, second = loads.sampler(9), loads.sampler(9)
    assert [first("kimi-conv") for _ in range(5)] == [second("kimi-conv") for _ in range(5)]


def test_load_times_other_kinds_and_errors() -> None:
    assert len(LoadTimes.from_trace(kind="lora_load").samples) == 27_415
    with pytest.raises(ValueError, match="no 'bogus' rows"):
        LoadTimes.from_trace(kind="bogus")
    with pytest.raises(ValueError, match="at least one"):
        LoadTimes([])
    assert LoadTimes([2.0], {"big": 3.0}).sample("big", random.Random(0)) == 6.0
