"""scripts/bench_split.py on a tiny trace of its own: the split pools' replays merge back onto
the whole trace's timeline, and every layout reports every request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_split.py"

# two models, one arriving 10 s after the other, loads of 2 s; beta's first request is larger
# than any 80 GB GPU holds (refused before the replay, so beta's pool counts from 10 s)
TINY = """\
arrival_s,model,priority,service_s,vram_gb,load_s
0,alpha,P0,5,30,2
5,beta,P2,5,200,2
10,beta,P2,5,30,2
"""


def run(tmp_path: Path, *extra: str) -> dict[str, Any]:
    tiny = tmp_path / "tiny.csv"
    tiny.write_text(TINY, encoding="utf-8")
    out = subprocess.run([sys.executable, str(SCRIPT), "--trace", str(tiny), "--gpus", "2",
                          "--splits", "1,2", "--speedup", "1", "--limit", "0", *extra],
                         capture_output=True, text=True, timeout=120,
                         env={**{k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")},
                              "GPUQ_TRACES": str(tmp_path / "absent")})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout) if "--json" in extra else {"text": out.stdout}


def test_split_pools_merge_onto_one_timeline(tmp_path: Path) -> None:
    report = run(tmp_path, "--json")
    one, two = report["layouts"]
    assert (one["pools"], one["gpus_per_pool"], two["pools"], two["gpus_per_pool"]) == (1, 2, 2, 1)
    # a pool per model: each pool's own replay starts at its first arrival; merged, beta's
    # pool is put back 10 s later, so both layouts end at 10 + 2 (load) + 5
    for layout in (one, two):
        assert layout["tasks"] == layout["succeeded"] == 2
        assert layout["makespan_s"] == 17
        assert layout["model_loads"] == 2
        assert layout["P2_wait_p50_s"] == 2
    # beta has more work (its refused request counted), so it is dealt first
    assert [p["requests"] for p in two["per_pool"]] == [2, 1]
    assert [p["makespan_s"] for p in two["per_pool"]] == [7, 7]


def test_text_table_names_each_layout(tmp_path: Path) -> None:
    text = run(tmp_path)["text"]
    assert "1x2" in text and "2x1" in text
