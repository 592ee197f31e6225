"""scripts/bench_scale.py at its smallest point: every figure of the report is there and real.

The sweep itself runs by hand (``python scripts/bench_scale.py``, docs/BENCHMARKS.md); here
one point (W 8, M 10, 300 queued, short phases) on the script's own server, through its
``main`` with ``--json``: the figures are checked for presence and sense, never for speed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

VERB_FIELDS = ("calls", "server_us", "inner_us", "inner_commands", "server_cpu_us", "p50_us", "p99_us")
POSITIVE = {
    "fleet": ("bytes_per_worker", "idle_lanes", "claimers", "models_held", "holders_per_held_model"),
    "fill": ("bytes_per_task", "fill_per_s"),
    "lifecycle": ("lifecycles", "per_s", "procs", "server_cpu_us", "script_us", "per_server_cpu_s",
                  "redis_cpu_share", "wall_s"),
    "reaper": ("server_cpu_ms", "script_ms", "other_commands_ms", "wall_ms", "commands", "runs"),
    "exporter": ("scrape_s", "series", "bytes", "runs"),
}


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench_scale

        assert bench_scale.main(args) == 0
    finally:
        sys.path.remove(str(SCRIPTS))
    return capsys.readouterr().out


def test_the_smallest_point_reports_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(["--workers", "8", "--models", "10", "--tasks", "300", "--calls", "40",
                    "--load-s", "0.5", "--procs", "1", "--json"], capsys)
    res = json.loads(out)
    assert res["environment"]["server"].split()[0] in ("redis", "valkey")
    (point,) = res["points"]
    assert (point["workers"], point["models"], point["tasks"]) == (8, 10, 300)
    for section, names in POSITIVE.items():
        for name in names:
            assert point[section][name] > 0, (section, name, point[section])
    verbs: dict[str, Any] = point["verbs"]
    for verb in ("enqueue", "claim", "ack", "cold_claim"):
        for name in VERB_FIELDS:
            assert verbs[verb][name] > 0, (verb, name, verbs[verb])
    assert verbs["claim"]["calls"] >= 40 and verbs["claim"]["empty"] == 0
    assert verbs["claim"]["warm_share"] == 1.0  # every claimer holds models with queued work
    assert verbs["ack"]["calls"] == verbs["enqueue"]["calls"] == verbs["claim"]["calls"]
    # an enqueue and an ack_claim a lifecycle: each worker's ack rides with its next claim, as
    # gpuq.worker sends them (a worker's first claim and last ack go alone)
    assert point["lifecycle"]["script_calls_per_lifecycle"] == pytest.approx(2.0, abs=0.1)
    assert point["fleet"]["idle_lanes"] == 1 and point["fleet"]["claimers"] == 7
    tenancy = point["reaper"]["tenancy_on"]
    assert tenancy["server_cpu_ms"] > 0 and tenancy["runs"] > 0 and "tenants_step_server_cpu_ms" in tenancy


def test_the_table_has_a_row_per_point(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(["--workers", "8", "--models", "10,20", "--tasks", "100", "--calls", "10",
                    "--load-s", "0.3", "--procs", "1"], capsys)
    rows = [line for line in out.splitlines() if line.startswith("| 8 |")]
    assert len(rows) == 2 and "–" not in "".join(rows), out


def test_bad_sizes_are_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        run_main(["--workers", "8", "--models", "0", "--tasks", "10"], capsys)
    assert exc.value.code == 2
    assert "positive integers" in capsys.readouterr().err
