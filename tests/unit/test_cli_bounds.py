"""Numbers, names and refusals at the CLI's edges: nan, infinities and out-of-range values
are one line before anything is written (most before Redis is reached), a class size an
older worker stored as nan does not break the pool's views, tenant and schedule commands
turn a server's refusal into one line, and names are escaped on output."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from test_cli import BASE, DEAD_REDIS, Pool, assert_clean_error

from gpuq.cli import cli
from gpuq.config import Config
from gpuq.embedded import EmbeddedServer
from gpuq.errors import ConfigError
from gpuq.sim.cli import check_plot_path
from gpuq.sim.run import parse_gpus
from gpuq.views.exporter import read_figures
from gpuq.views.inspect import class_gb

WORKER = ["worker", "--app", "workers.sim:app", "--gpu-name", "L4"]


@pytest.fixture
def cli_pool(redis_server: EmbeddedServer, pool: str, prefix: str) -> Iterator[Pool]:
    p = Pool(redis_server.url, pool, prefix)
    yield p
    p.redis.close()


# -- refused before Redis is reached --------------------------------------------------------

EARLY: list[tuple[list[str], str]] = [
    # a QA pass: 100,000 runner threads took 12 s to start, to do nothing
    (["worker", "--app", "workers.sim:app", "--vram-gb", "24", "--concurrency", "100000"],
     "concurrency must be 1..4096, got 100000"),
    (["worker", "--app", "workers.sim:app", "--vram-gb", "24", "--metrics-port", "99999"],
     "--metrics-port must be 0..65535 (0: none), got 99999"),
    (["worker", "--app", "workers.sim:app", "--vram-gb", "24", "--idle-timeout", "nan"],
     "--idle-timeout must be a finite number >= 0, got nan"),
    (["worker", "--app", "workers.sim:app", "--vram-gb", "24", "--idle-timeout", "inf"],
     "--idle-timeout must be a finite number >= 0"),
    (["worker", "--app", "workers.sim:app", "--vram-gb", "24", "--load-backoff", "-1"],
     "--load-backoff must be a finite number >= 0, got -1.0"),
    (["worker", "--app", "workers.sim:app", "--vram-gb", "24", "--load-backoff", "60",
      "--load-backoff-max", "10"],
     "load_backoff_max_s (10.0) must be >= load_backoff_s (60.0)"),
    (["worker", "--app", "workers.sim:app", "--vram-gb", "24", "--priorities", "P0,,P1"],
     "--priorities 'P0,,P1': an item is empty"),
    (["exporter", "--port", "99999"], "--port must be 1..65535, got 99999"),
    (["exporter", "--port", "0"], "--port must be 1..65535, got 0"),
    (["reaper", "--once", "--grace", "nan"], "--grace must be a finite number >= 0, got nan"),
    (["reaper", "--once", "--max-wait", "nan"], "--max-wait must be a finite number >= 0, got nan"),
    (["top", "--once", "--interval", "0"], "--interval must be a finite number > 0, got 0.0"),
    (["top", "--once", "--interval", "-1"], "--interval must be a finite number > 0"),
    (["top", "--once", "--interval", "nan"], "--interval must be a finite number > 0, got nan"),
    (["enqueue", *BASE, "--wait", "--timeout", "nan"], "--timeout must be a number of seconds >= 0"),
    (["enqueue", *BASE, "--stream", "--timeout", "-1"], "--timeout must be a number of seconds >= 0"),
]
NAMES = ["a b", "a{b}", "", "a,b", "a\x1bb", "x" * 201, "w:tasks"]
SIMULATE: list[tuple[list[str], str]] = [
    (["--speedup", "nan"], "--speedup must be a finite number > 0, got nan"),
    (["--speedup", "inf"], "--speedup must be a finite number > 0, got inf"),
    (["--target-load", "nan"], "--target-load must be a finite number > 0"),
    (["--target-load", "inf"], "--target-load must be a finite number > 0"),
    (["--target-load", "0"], "--target-load must be a finite number > 0, got 0.0"),
    (["--find-gpus", "--gpus", "1x80", "--sla-target", "nan"], "--sla-target must be 0..1, got nan"),
    (["--find-gpus", "--gpus", "1x80", "--sla-target", "2"], "--sla-target must be 0..1, got 2.0"),
    (["--autoscale", "1:2", "--gpus", "1x80", "--idle-s", "nan"], "--idle-s must be a finite number >= 0"),
    (["--autoscale", "1:2", "--gpus", "1x80", "--scale-every-s", "nan"], "--scale-every-s must be"),
    (["--plot", "/nonexistent-gpuq-dir/x.png"], "--plot '/nonexistent-gpuq-dir/x.png': not a file"),
    (["--gpus", "1000000x80"], "1000000 GPUs; a replay simulates at most 4096"),
    (["--gpus", "4000x1x80,2x64x80"], "4128 GPUs; a replay simulates at most 4096"),
    (["--find-gpus", "--gpus", "10000x80"], "10000 GPUs; a replay simulates at most 4096"),
    (["--autoscale", "1:100000", "--gpus", "1x80"], "--autoscale '1:100000': a replay simulates at most"),
    # regressions: an error from the claim script mid-replay, and a group no worker may form
    (["--gpus", "1x100000000000000000"], "at most 1e+06 GB each"),
    (["--gpus", "2x65x80"], "groups of 1..64 GPUs"),
    # regressions: passed over without a word (no plot written, no 70B mix, no tenants)
    (["--autoscale", "1:2", "--gpus", "1x80", "--plot", "x.png", "--tenant", "a"],
     "--autoscale replays gpuq alone; it does not take --plot, --tenant"),
    (["--find-gpus", "--gpus", "1x80", "--mix-70b", "0.5", "--policy", "fifo"],
     "--find-gpus replays gpuq alone; it does not take --mix-70b, --policy fifo"),
    (["--find-gpus", "--gpus", "1x80", "--speedup", "1", "--target-load", "0.5"],
     "give --speedup or --target-load, not both"),
    (["--gpus", "1x80", "--boot-s", "5"], "--boot-s is only used with --autoscale"),
    (["--gpus", "1x80", "--scale-signal", "forecast", "--idle-s", "3"],
     "--scale-signal, --idle-s are only used with --autoscale"),
    (["--gpus", "1x80", "--sla-priority", "P1"], "--sla-priority is only used with --find-gpus"),
    (["--gpus", "1x80", "--policy", "fifo", "--warm-hints"],
     "--warm-hints is for gpuq's replays; --policy fifo runs none"),
    (["--autoscale", "1:2", "--gpus", "1x80", "--sla-target", "0.5"],
     "--sla-target is only used with --find-gpus"),
    (["--autoscale", "1:2", "--gpus", "1x80", "--scale-every-s", "0.01"],
     "--scale-every-s must be a finite number >= 0.1, got 0.01"),
]


@pytest.mark.parametrize("args, fragment", EARLY, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_out_of_range_numbers_are_refused_before_redis(args: list[str], fragment: str) -> None:
    result = CliRunner().invoke(cli, ["--redis", DEAD_REDIS, *args])
    assert_clean_error(result, f"configuration: {fragment}")


@pytest.mark.parametrize("name", NAMES, ids=repr)
def test_worker_names_that_break_keys_or_screens_are_refused(name: str) -> None:
    result = CliRunner().invoke(cli, ["--redis", DEAD_REDIS, *WORKER, "--vram-gb", "24", "--name", name])
    assert_clean_error(result, "a worker id must be 1..200 printable characters without spaces, "
                               "commas, braces or colons")


@pytest.mark.parametrize("args, fragment", SIMULATE, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_simulate_refuses_before_it_replays(args: list[str], fragment: str) -> None:
    assert_clean_error(CliRunner().invoke(cli, ["--redis", DEAD_REDIS, "simulate", *args]), fragment)


def test_plot_paths_and_gpu_counts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a file that can be written"):
        check_plot_path(str(tmp_path))  # a folder
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # said before the replay, not after it
        with pytest.raises(ConfigError, match="--plot needs matplotlib"):
            check_plot_path(str(tmp_path / "x.png"))
    else:
        check_plot_path(str(tmp_path / "x.png"))
        check_plot_path(str(tmp_path / "no_extension"))  # written as PNG
        with pytest.raises(ConfigError, match=r"\.xyz is not a picture format"):
            check_plot_path(str(tmp_path / "x.xyz"))  # regression: a traceback after the replay
    assert len(parse_gpus("4095x80,1x80/01")) == 4096
    assert len(parse_gpus("1024x4x80")) == 1024  # one worker per group of four


# -- refused before anything is registered or enqueued --------------------------------------

@pytest.mark.parametrize("vram", [["--vram-gb", "nan"], ["--vram-gb", "inf"], ["--vram-gb", "1e308"],
                                  ["--vram-gb", "1e308", "--gpu-count", "2"]], ids=" ".join)
def test_a_worker_declaring_no_sane_size_registers_nothing(cli_pool: Pool, vram: list[str]) -> None:
    result = cli_pool.invoke(*WORKER, "--burst", *vram)
    assert_clean_error(result, "--vram-gb must be > 0 and <= 1000000 (GB per GPU)")
    assert cli_pool.all_keys() == set()


@pytest.mark.parametrize("timeout", ["nan", "-1", "-inf"])
def test_a_bad_wait_timeout_enqueues_nothing(cli_pool: Pool, timeout: str) -> None:
    assert_clean_error(cli_pool.invoke("enqueue", *BASE, "--wait", "--timeout", timeout), "--timeout")
    assert cli_pool.all_keys() == set()


# -- a non-finite class size an older worker wrote -------------------------------------------

def test_views_skip_class_sizes_that_are_not_finite_numbers(cli_pool: Pool) -> None:
    cli_pool.redis.hset(cli_pool.keys.classes, mapping={"L4": "nan", "H100": "inf", "X": "abc",
                                                        "A100-40": "35"})
    big = cli_pool.ok("enqueue", "sim.run", "--model", "m", "--vram-gb", "60").strip()
    view = json.loads(cli_pool.ok("status", "--json"))
    assert (view["largest_gpu_gb"], view["unschedulable_ids"]) == (35.0, [big])
    assert "unschedulable: 1 queued task(s)" in cli_pool.ok("status")
    assert "1 unschedulable" in cli_pool.ok("top", "--once")
    assert read_figures(cli_pool.redis, cli_pool.keys).unschedulable == 1
    assert [class_gb(v) for v in ("24", "-inf", "nan", "", "1e400")] == [24.0, None, None, None, None]


# -- a server's refusal is one line ------------------------------------------------------------

@pytest.fixture
def ping_only(cli_pool: Pool) -> Iterator[str]:
    """The URL of a user allowed PING and nothing else (gone after the test)."""
    user = f"pingonly-{uuid.uuid4().hex[:8]}"
    admin = redis.Redis.from_url(cli_pool.url)
    admin.acl_setuser(user, enabled=True, passwords=["+pw"], commands=["+ping"])
    try:
        yield cli_pool.url.replace("redis://", f"redis://{user}:pw@", 1)
    finally:
        admin.acl_deluser(user)
        admin.close()


@pytest.mark.parametrize("args", [["tenant", "list"], ["tenant", "set", "a"], ["tenant", "rm", "a"],
                                  ["tenant", "require", "on"], ["schedule", "list"],
                                  ["schedule", "add", "s", "--every", "1m", "--", *BASE],
                                  ["schedule", "remove", "s"]], ids=" ".join)
def test_tenant_and_schedule_refusals_are_one_line(cli_pool: Pool, ping_only: str, args: list[str]) -> None:
    result = cli_pool.invoke(*args, url=ping_only)
    assert_clean_error(result, "refused a command to this user", ":***@")  # the password masked
    assert cli_pool.all_keys() == set()


# -- names are escaped on output --------------------------------------------------------------

def test_task_text_escapes_control_characters(cli_pool: Pool) -> None:
    """Enqueue refuses a name with a control character (one line, nothing written); a hash
    that holds one anyway (written by hand, or before names were checked for them) shows
    it escaped."""
    assert_clean_error(cli_pool.invoke("enqueue", "sim\x1b[31mrun", "--model", "m", "--vram-gb", "1"),
                       "control characters")
    assert cli_pool.all_keys() == set()
    task_id = cli_pool.ok("enqueue", "sim.run", "--model", "m", "--vram-gb", "1").strip()
    cli_pool.redis.hset(cli_pool.keys.task(task_id), mapping={
        "handler": "sim\x1b[31mrun", "model": "m\x1b]0;x\x07", "tenant": "t\x01"})
    out = cli_pool.ok("task", task_id)
    assert "\x1b" not in out and "\x01" not in out and "\x07" not in out
    assert "handler       sim\\x1b[31mrun" in out.splitlines()
    assert "tenant        t\\x01" in out.splitlines()
    assert json.loads(cli_pool.ok("task", task_id, "--json"))["handler"] == "sim\x1b[31mrun"


@pytest.mark.parametrize("name, value", [("GPUQ_FORECAST_DAY_S", "nan"),
                                         ("GPUQ_FORECAST_LEAD_S", "inf"),
                                         ("GPUQ_SCALE_TARGET_S", "-inf")])
def test_settings_that_are_not_finite_are_refused_at_start(name: str, value: str) -> None:
    """Regression: "nan" passed the >= 0 check and broke the reaper's scale step each round."""
    with pytest.raises(ConfigError, match="must be a finite number"):
        Config.from_env({name: value})


@pytest.mark.parametrize("priority, fragment", [(3, "P3 has no SLA"), (1, "the trace has no P1 task")])
def test_find_gpus_refuses_a_priority_with_nothing_to_search_for(priority: int, fragment: str) -> None:
    """Regression: it replayed pools of 1 to 256 GPUs, then said none met the target."""
    from gpuq.config import Config
    from gpuq.sim.cli import _reachable
    from gpuq.sim.model import TraceTask
    from gpuq.sim.traces import LoadTimes

    tasks = [TraceTask(0.0, "m", 10.0, p, 1.0, 1.0) for p in (0, 3)]
    with pytest.raises(ConfigError, match=fragment):
        _reachable(tasks, LoadTimes([1.0]), Config(), 80.0, 0.0, priority)


def test_traces_dir_must_be_a_folder(tmp_path: Path) -> None:
    """Regression: a file given as --traces-dir was read as the trace and as the load times
    (a KeyError traceback)."""
    from gpuq.sim.cli import read_trace

    file = tmp_path / "requests.csv"
    file.write_text("arrival_s,model,priority,service_s\n0,m,P0,1\n")
    with pytest.raises(ConfigError, match="--traces-dir .* is not a folder"):
        read_trace("genai", str(file), 1, 10)


@pytest.mark.parametrize("prefix", ["q{x}", "q{", "a b", "q\"x", ""])
def test_a_prefix_that_would_move_the_pools_hash_tag_is_refused_at_start(prefix: str) -> None:
    """Regression: GPUQ_PREFIX='q{x}' made every pool's keys hash on "x" (one slot for all
    pools, not gpuq.cluster.pool_slot's); on a Redis Cluster `gpuq status` died with a MovedError
    traceback. A prefix gets the pool name's rule, colons allowed. An empty one (a QA pass:
    `GPUQ_PREFIX=` wrote `:{pool}:...` keys, a keyspace no process without it shares) too."""
    with pytest.raises(ConfigError, match="prefix"):
        Config.from_env({"GPUQ_PREFIX": prefix}).validate()
    assert Config.from_env({"GPUQ_PREFIX": "team:gpuq"}).validate().prefix == "team:gpuq"
