"""``gpuq simulate --trace FILE`` end to end on a CSV of one's own requests: a report, the same
twice, and a bad row as one error line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import Procs

from gpuq.embedded import EmbeddedServer

TINY = """\
arrival_s,model,priority,service_s,vram_gb,tenant,load_s
0,llama,P0,2,30,acme,12
0.5,sdxl,batch,20,18,beta,8
1,llama,online,1,30,,
2,sdxl,P3,10,18,beta,
3,llama,P1,3,30,acme,
"""


@pytest.fixture
def procs(redis_server: EmbeddedServer, pool: str, prefix: str, tmp_path: Path) -> Iterator[Procs]:
    with Procs(redis_server.url, pool, prefix, tmp_path) as p:
        yield p


def test_cli_replays_a_csv_of_ones_own_requests(procs: Procs, tmp_path: Path) -> None:
    tiny = tmp_path / "tiny.csv"
    tiny.write_text(TINY, encoding="utf-8")
    # every model gives its load times: no shared trace is needed
    env = {"GPUQ_TRACES": str(tmp_path / "absent"), "GPUQ_REAP_INTERVAL_S": "1"}
    args = ("simulate", "--trace", str(tiny), "--gpus", "1x80", "--speedup", "1", "--policy", "gpuq",
            "--json")
    runs = [procs.cli(*args, env=env) for _ in range(2)]
    for out in runs:
        assert out.returncode == 0, out.stderr
    reports = [json.loads(out.stdout) for out in runs]
    for report in reports:
        report.pop("wall_s")
    assert reports[0] == reports[1]
    report = reports[0]
    assert report["trace"] == str(tiny) and report["policy"] == "gpuq" and report["speedup"] == 1
    assert {p: v["tasks"] for p, v in report["priorities"].items()} == {"P0": 2, "P1": 1, "P2": 1, "P3": 1}
    assert report["starved"] == 0 and report["model_loads"] >= 2
    assert report["makespan_s"] >= 12 + 2 + 1 + 3  # llama's load (its only load_s) and runs


def test_cli_names_the_bad_row_in_one_error_line(procs: Procs, tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(TINY.replace("2,sdxl,P3,10", "2,sdxl,P3,ten"), encoding="utf-8")
    out = procs.cli("simulate", "--trace", str(bad), "--policy", "fifo")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), out.stderr
    assert f"{bad} line 5: service_s 'ten' is not a number" in lines[0]
