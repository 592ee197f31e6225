"""A CSV of one's own requests as a trace: columns, defaults, every kind of bad input, gzip,
and files of the shared traces known by their header."""

from __future__ import annotations

import gzip
import os
import random
import shutil
from pathlib import Path

import pytest

from gpuq.sim import traces
from gpuq.sim.model import TraceTask
from gpuq.sim.trace_csv import DEFAULT_VRAM_GB
from gpuq.sim.traces import LoadTimes, read_trace

GOOD = """\
arrival_s,model,priority,service_s,vram_gb,deadline_s,tenant,load_s,notes
100,llama,P0,2.5,30,,acme,12,first
100.5,llama,online,1.5,30,60,,,
101,sdxl,2,20,18,,beta,8,
99,sdxl,batch,10,18,,beta,,arrives first
104,llama,3,5,30,,acme,10,
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def message(path: Path) -> str:
    with pytest.raises(ValueError) as exc:
        read_trace(str(path))
    return str(exc.value)


def test_a_good_file_gives_tasks_sorted_by_arrival_from_zero(tmp_path: Path) -> None:
    got = read_trace(str(write(tmp_path / "mine.csv", GOOD)))
    assert got.rows == 5 and got.skipped == {} and got.path == tmp_path / "mine.csv"
    assert [t.arrival_s for t in got.tasks] == [0.0, 1.0, 1.5, 2.0, 5.0]
    first, p0 = got.tasks[0], got.tasks[1]
    assert first == TraceTask(arrival_s=0.0, model="sdxl", vram_gb=18.0, priority=2, service_s=10.0,
                              est_s=15.0, deadline_s=None, preemptible=True, tenant="beta")
    # est_s: the model's mean service time; tenant and deadline default when empty
    assert p0 == TraceTask(1.0, "llama", 30.0, 0, 2.5, 3.0, None, False, "acme")
    assert (got.tasks[2].priority, got.tasks[2].deadline_s, got.tasks[2].tenant) == (0, 60.0, "default")
    assert got.tasks[4].priority == 3 and got.tasks[4].preemptible
    assert got.load_s == {"llama": (12.0, 10.0), "sdxl": (8.0,)}
    assert read_trace(str(tmp_path / "mine.csv"), limit=2).tasks == got.tasks[:2]


def test_optional_columns_and_their_defaults(tmp_path: Path) -> None:
    text = ("model,service_s,priority,arrival_s,est_s,preemptible\n"
            "m,4,P0,1700000000,1,yes\n"
            "m,6,P3,1700000030,,FALSE\n")
    tasks = read_trace(str(write(tmp_path / "epoch.csv", text))).tasks
    assert [t.arrival_s for t in tasks] == [0.0, 30.0]  # an epoch counts from the first request
    assert [t.est_s for t in tasks] == [1.0, 5.0]
    assert [t.preemptible for t in tasks] == [True, False]
    assert {t.vram_gb for t in tasks} == {DEFAULT_VRAM_GB}


def test_a_gpus_column_makes_tasks_that_run_across_a_group(tmp_path: Path) -> None:
    """Found by a groups user: a `gpus` column was ignored (other columns are), so 2-GPU
    144 GB requests ran on single 192 GB GPUs in the replay."""
    text = "arrival_s,model,priority,service_s,vram_gb,gpus\n0,llama-70b,P1,3,144,2\n1,m,P2,1,8,\n"
    tasks = read_trace(str(write(tmp_path / "tp.csv", text))).tasks
    assert [t.gpus for t in tasks] == [2, 1]
    for bad, said in (("0", "gpus must be an integer in 1..64"), ("1.5", "gpus must be a whole number")):
        assert said in message(write(tmp_path / "bad.csv", text.replace(",144,2", f",144,{bad}")))


def test_iso_times_count_from_the_first(tmp_path: Path) -> None:
    text = ("arrival_s,model,priority,service_s\n"
            "2025-03-01T10:00:00Z,m,P1,1\n"
            "2025-03-01T10:00:02.5+00:00,m,P1,1\n"
            "2025-03-01 10:01:00,m,P1,1\n")  # no zone: UTC
    tasks = read_trace(str(write(tmp_path / "iso.csv", text))).tasks
    assert [t.arrival_s for t in tasks] == [0.0, 2.5, 60.0]


def test_a_gzip_file_reads_as_the_plain_one_whatever_its_name(tmp_path: Path) -> None:
    plain = read_trace(str(write(tmp_path / "mine.csv", GOOD))).tasks
    assert read_trace(str(write(tmp_path / "bom.csv", "\ufeff" + GOOD))).tasks == plain  # spreadsheets
    for name in ("mine.csv.gz", "mine-gzipped.csv"):
        with gzip.open(tmp_path / name, "wt", encoding="utf-8") as f:
            f.write(GOOD)
        assert read_trace(str(tmp_path / name)).tasks == plain


@pytest.mark.parametrize("text, expected", [
    ("", "is empty: a trace CSV needs a header with arrival_s, model, priority, service_s"),
    ("arrival_s,model,priority\n1,m,P0\n", "no column service_s; a trace CSV needs"),
    ("arrival_s,model,service_s\n1,m,1\n", "no column priority"),
    ("time,model,priority,service_s,model\n", "column model appears more than once"),
])
def test_a_missing_or_repeated_column_is_one_error(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in message(write(tmp_path / "t.csv", text))


@pytest.mark.parametrize("row, expected", [
    ("soon,m,P0,1", "arrival_s 'soon' is neither seconds nor an ISO 8601 time"),
    ("1,m,P9,1", "unknown priority 'P9'"),
    ("1,m,P0,fast", "service_s 'fast' is not a number"),
    ("1,m,P0,-2", "service_s must be >= 0 and at most 1e+10, got '-2'"),
    # regressions: past what a replay's clock holds, a traceback or an error naming est_s
    ("1,m,P0,2e10", "service_s must be >= 0 and at most 1e+10, got '2e10'"),
    ("1,m,P0,1,,,,1e308", "load_s must be >= 0 and at most 1e+10"),
    ("1e13,m,P0,1", "arrival_s must be at most 1e+10 in size, got '1e13'"),
    ("1,m,P0,inf", "service_s must be a finite number, got 'inf'"),
    ("1,,P0,1", "model must be a non-empty string"),
    ("1,my model,P0,1", "model 'my model' holds spaces, commas, braces or control characters"),
    ("1,m,P0,1,0", "vram_gb must be a finite number > 0"),
    ("1,m,P0,1,big", "vram_gb 'big' is not a number"),
    ("1,m,P0,1,,-5", "deadline_s must be a finite number > 0"),
    ("1,m,P0,1,,,a{b}", "tenant 'a{b}'"),
    ("1,m,P0,1,,,,-1", "load_s must be >= 0"),
    ("1,m,P0,1,,,,,maybe", "preemptible must be true or false, got 'maybe'"),
    ("1,m,P0,1,,,,,,nan", "est_s must be a finite number, got 'nan'"),
    ("1,m,P0,1,,,,,,,extra", "line 3: 11 values for 10 columns"),
    ("1,m,P0", "line 3: 3 values for 10 columns"),
])
def test_a_bad_value_is_one_error_naming_its_line(tmp_path: Path, row: str, expected: str) -> None:
    header = "arrival_s,model,priority,service_s,vram_gb,deadline_s,tenant,load_s,preemptible,est_s"
    if "values for" not in expected:
        row += "," * (header.count(",") - row.count(","))  # the columns left empty
    file = write(tmp_path / "t.csv", f"{header}\n1,m,P0,1,,,,,,\n{row}\n")
    got = message(file)
    assert f"{file} line 3: " in got and expected in got, got
    assert "\n" not in got


def test_an_unreadable_file_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "cut.csv.gz").write_bytes(gzip.compress(GOOD.encode())[:40])
    assert "is not readable CSV text (plain or gzip'd)" in message(tmp_path / "cut.csv.gz")
    latin = "arrival_s,model,priority,service_s\n1,caf\xe9,P0,1\n".encode("latin-1")
    (tmp_path / "latin.csv").write_bytes(latin)
    assert "is not readable CSV text" in message(tmp_path / "latin.csv")
    with pytest.raises(FileNotFoundError, match="trace file .*absent.csv not found"):
        read_trace(str(tmp_path / "absent.csv"))
    with pytest.raises(FileNotFoundError, match="is a directory, not a CSV file"):
        read_trace(f"{tmp_path}/")


def test_load_times_given_by_the_file_replace_the_measured_ones(tmp_path: Path) -> None:
    got = read_trace(str(write(tmp_path / "mine.csv", GOOD)))
    loads = LoadTimes.for_trace(got, tmp_path)  # every model has load_s: no load trace needed
    rng = random.Random(1)
    assert {loads.sample("llama", rng) for _ in range(50)} == {12.0, 10.0}
    assert loads.sample("sdxl", rng) == 8.0 and loads.mean_s("llama") == 11.0
    partial = write(tmp_path / "partial.csv", "arrival_s,model,priority,service_s,load_s\n"
                                              "0,m,P0,1,4\n1,n,P0,1,\n2,o,P0,1,\n")
    with pytest.raises(FileNotFoundError, match="gives no load_s for model n and 1 more, and the "
                                                "measured load times are not there"):
        LoadTimes.for_trace(read_trace(str(partial)), tmp_path)
    measured = LoadTimes([3.0], given={"m": [4.0]})
    assert (measured.sample("m", rng), measured.sample("n", rng)) == (4.0, 3.0)


# the shared traces, when they are here: a file of one is known by its header
SHARED = Path(os.environ.get(traces.ENV_VAR) or traces.DEFAULT_DIR)


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not found at {SHARED}")
@pytest.mark.parametrize("name", sorted(traces.TRACES))
def test_a_shared_trace_file_anywhere_is_read_by_its_reader(tmp_path: Path, name: str) -> None:
    copy = tmp_path / "renamed.csv.gz"
    shutil.copy(SHARED / traces.TRACES[name], copy)
    assert traces.known_format(copy) == name
    by_path = read_trace(str(copy), seed=2, limit=500)
    by_name = read_trace(name, SHARED, seed=2, limit=500)
    assert (by_path.tasks, by_path.rows, by_path.skipped) == (by_name.tasks, by_name.rows, by_name.skipped)


def test_a_broken_file_of_a_known_format_is_one_error(tmp_path: Path) -> None:
    header = ",".join(traces.HEADERS["openb"])
    file = write(tmp_path / "openb.csv", f"{header}\n0,j,x,,,1,1,16,1,1,LS,P0,Running,0,0\n")
    assert traces.known_format(file) == "openb"
    got = message(file)
    assert f"{file} line 2 has the columns of the openb trace, but is not a row of it: " in got, got
    short = write(tmp_path / "short.csv", f"{header}\n0,j,x\n")  # found by a QA pass: KeyError: 'status'
    assert message(short).endswith("line 2 has the columns of the openb trace, but is not a row of it: "
                                   "no value in column 'num_gpus'"), message(short)


GENAI_ROW = "{arrival},{model},,,{service},TXT_2_IMG,SUCCEED,G0001,0,1,30,63"


@pytest.mark.parametrize("arrival, service, expected", [
    ("nan", "10", "arrival_s must be finite"),  # regressions: a traceback deep in the replay
    ("0", "nan", "service_s must be >= 0"),
    ("2e10", "10", "arrival_s must be finite and at most 1e+10"),
])
def test_a_value_out_of_range_in_a_file_of_a_known_format_is_one_error(
        tmp_path: Path, arrival: str, service: str, expected: str) -> None:
    header = ",".join(traces.HEADERS["genai"])
    rows = [GENAI_ROW.format(arrival=0, model="M0", service=32),
            GENAI_ROW.format(arrival=arrival, model="M1", service=service)]
    file = write(tmp_path / "genai.csv", "\n".join([header, *rows]) + "\n")
    got = message(file)
    assert "has the columns of the genai trace, but is not a row of it: " + expected in got, got


def test_an_iso_time_past_the_clocks_bound_is_one_error(tmp_path: Path) -> None:
    file = write(tmp_path / "iso.csv", "arrival_s,model,priority,service_s\n"
                                       "0001-01-01T00:00:00,m,P0,1\n2024-01-01T00:00:00,m,P0,1\n")
    assert "line 2: arrival_s must be at most 1e+10 s from the epoch" in message(file)


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not found at {SHARED}")
def test_a_shared_trace_whose_header_has_spaces_is_still_read(tmp_path: Path) -> None:
    """Regression: its format was known from the stripped header, then its rows were read
    with the unstripped names, and the error blamed the rows."""
    with gzip.open(SHARED / traces.TRACES["azure"], "rt") as f:
        head, *rows = [next(f) for _ in range(50)]
    spaced = write(tmp_path / "az.csv", head.replace(",", ", ") + "".join(rows))
    assert len(read_trace(str(spaced), seed=1).tasks) == 49
