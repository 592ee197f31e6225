"""The gpuq CLI through click's CliRunner, against the suite's real Redis server.

Every bad input must end in a non-zero exit and one "Error: ..." line on stderr, with no
traceback and nothing written to the pool.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import fields as dataclass_fields
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from gpuq import worker_record
from gpuq.cli import cli
from gpuq.embedded import EmbeddedServer
from gpuq.keys import Keys
from gpuq.task import TaskRecord
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.presence import Presence

DEAD_REDIS = "redis://127.0.0.1:1/0"
# the CLI adds the last three
TASK_FIELDS = {f.name for f in dataclass_fields(TaskRecord)} | {"children", "parked", "pickup_by"}
BASE = ["sim.run", "--model", "llama3-8b", "--vram-gb", "16"]


class Pool:
    """The test's pool: run CLI commands on it and look at its keys."""

    def __init__(self, url: str, name: str, prefix: str) -> None:
        self.url = url
        self.name = name
        self.prefix = prefix
        self.keys = Keys(name, prefix)
        self.redis = redis.Redis.from_url(url, decode_responses=True)

    def invoke(self, *args: str, url: str | None = None, env: dict[str, str] | None = None) -> Result:
        return CliRunner().invoke(cli, ["--redis", url or self.url, "--pool", self.name, *args],
                                  env={"GPUQ_PREFIX": self.prefix, **(env or {})})

    def ok(self, *args: str) -> str:
        result = self.invoke(*args)
        assert result.exit_code == 0, (result.output, result.exception)
        return result.stdout

    def all_keys(self) -> set[str]:
        return set(self.redis.scan_iter(match=self.keys.pattern, count=1000))

    def register_gpu(self, worker_id: str, name: str, total_gb: float) -> None:
        gpu = GpuInfo(name, f"uuid-{worker_id}", total_gb, None, "declared")
        fields = worker_record.identity(worker_id, gpu, 5.0, 1, "0123", "host", 1, handlers=["sim.run"])
        Presence(self.redis, self.keys, worker_id).register(fields, 30_000)


@pytest.fixture
def cli_pool(redis_server: EmbeddedServer, pool: str, prefix: str) -> Iterator[Pool]:
    p = Pool(redis_server.url, pool, prefix)
    yield p
    p.redis.close()


def assert_clean_error(result: Result, *fragments: str) -> str:
    """Non-zero exit, a single "Error: ..." line, no traceback; returns the message."""
    assert result.exit_code not in (0, None), result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), lines[0]
    assert "Traceback" not in result.output
    assert result.stdout == ""
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# -- enqueue and task --------------------------------------------------------------------

def test_enqueue_prints_an_id_and_task_json_shows_every_field(cli_pool: Pool) -> None:
    before = time.time()
    out = cli_pool.ok("enqueue", "sim.run", "--payload", '{"prompt": "hi", "n": [1, 2]}',
                      "--model", "llama3-8b", "--vram-gb", "16.5", "--priority", "nearline",
                      "--est-s", "0.4", "--deadline-s", "30", "--tenant", "acme", "--no-preempt",
                      "--max-attempts", "5")
    after = time.time()
    task_id = out.strip()
    assert re.fullmatch(r"[0-9a-f]{32}", task_id), out

    record = json.loads(cli_pool.ok("task", task_id, "--json"))
    assert set(record) == TASK_FIELDS
    assert record == {**record, "id": task_id, "handler": "sim.run",
                      "payload": {"prompt": "hi", "n": [1, 2]}, "model": "llama3-8b",
                      "vram_gb": 16.5, "priority": "P1", "est_s": 0.4, "preemptible": False,
                      "tenant": "acme", "max_attempts": 5, "attempt": 0, "state": "queued",
                      "worker": None, "token": None, "started_at": None, "finished_at": None,
                      "result": None, "error": None}
    # timestamps are epoch seconds (not milliseconds)
    assert before - 1 <= record["enqueued_at"] <= after + 1
    assert record["deadline"] == pytest.approx(record["enqueued_at"] + 30, abs=0.01)


def test_task_with_a_damaged_hash_is_one_line(cli_pool: Pool) -> None:
    task_id = cli_pool.ok("enqueue", *BASE).strip()
    cli_pool.redis.hset(cli_pool.keys.task(task_id), "vram_gb", "abc")
    assert_clean_error(cli_pool.invoke("task", task_id), f"task {task_id} is stored corrupt: ValueError")
    cli_pool.redis.hdel(cli_pool.keys.task(task_id), "handler")
    assert_clean_error(cli_pool.invoke("task", task_id, "--json"), "field handler is missing")


def test_task_text_lists_every_field(cli_pool: Pool) -> None:
    task_id = cli_pool.ok("enqueue", *BASE, "--payload", '{"a": 1}').strip()
    lines = cli_pool.ok("task", task_id).splitlines()
    assert [line.split()[0] for line in lines] == [*TaskRecord.__dataclass_fields__, "children", "parked",
                                                      "pickup_by"]
    assert f"id            {task_id}" in lines
    assert 'payload       {"a": 1}' in lines
    assert "state         queued" in lines


@pytest.mark.parametrize("given, label", [("P0", "P0"), ("0", "P0"), ("online", "P0"),
                                          ("nearline", "P1"), ("batch", "P2"), ("p3", "P3"),
                                          ("OFFLINE", "P3")])
def test_priority_names_and_numbers(cli_pool: Pool, given: str, label: str) -> None:
    task_id = cli_pool.ok("enqueue", *BASE, "--priority", given).strip()
    assert json.loads(cli_pool.ok("task", task_id, "--json"))["priority"] == label


def test_enqueue_defaults(cli_pool: Pool) -> None:
    task_id = cli_pool.ok("enqueue", *BASE).strip()
    record = json.loads(cli_pool.ok("task", task_id, "--json"))
    assert record["payload"] is None and record["priority"] == "P2"
    assert record["preemptible"] is True and record["max_attempts"] == 3
    assert record["deadline"] is None and record["tenant"] == "default"


def test_enqueue_without_an_estimate_takes_the_learned_one(cli_pool: Pool) -> None:
    plain = json.loads(cli_pool.ok("task", cli_pool.ok("enqueue", *BASE).strip(), "--json"))
    assert (plain["est_s"], plain["est_from"]) == (1.0, None)  # nothing learned: 1 s
    cli_pool.redis.hset(cli_pool.keys.runtimes, "sim.run llama3-8b", "3.5 6 20")
    learned = json.loads(cli_pool.ok("task", cli_pool.ok("enqueue", *BASE).strip(), "--json"))
    assert (learned["est_s"], learned["est_from"]) == (3.5, "history")
    text = cli_pool.ok("status")
    assert "run times learned from successful runs" in text
    assert [line.split() for line in text.splitlines() if line.startswith("sim.run")] == [
        ["sim.run", "llama3-8b", "3.500s", "6.000s", "20"]]
    assert json.loads(cli_pool.ok("status", "--json"))["runtimes"] == [
        {"handler": "sim.run", "model": "llama3-8b", "mean_s": 3.5, "p90_s": 6.0, "samples": 20}]


# -- status -------------------------------------------------------------------------------

def test_status_json_shape(cli_pool: Pool) -> None:
    empty = json.loads(cli_pool.ok("status", "--json"))
    assert empty == {"pool": cli_pool.name, "queues": [], "workers": [], "running": 0,
                     "delayed": 0, "unschedulable": 0, "unschedulable_ids": [],
                     "largest_gpu_gb": 0.0, "stats": {}, "class_shapes": [], "parked": 0,
                     "models": [], "reservations": [],
                     "yield_requests": [], "scale": {}, "unregistered": {}, "runtimes": [],
                     "tenants": [], "tenants_required": False, "progress": {}, "waiting": 0,
                     "schedules": 0, "warnings": [], "reaper_active": False,
                     "scale_age_s": None}

    cli_pool.register_gpu("w-a100", "A100-40", 40)
    ids = [cli_pool.ok("enqueue", *BASE, "--priority", "P0").strip() for _ in range(2)]
    big = cli_pool.ok("enqueue", "sim.run", "--model", "llama3-70b", "--vram-gb", "60").strip()
    typo = cli_pool.ok("enqueue", "nope.x", "--model", "llama3-8b", "--vram-gb", "4").strip()
    view = json.loads(cli_pool.ok("status", "--json"))
    assert view["pool"] == cli_pool.name
    queues = {(q["priority"], q["model"]): q for q in view["queues"]}
    assert set(queues) == {("P0", "llama3-8b"), ("P2", "llama3-8b"), ("P2", "llama3-70b")}
    assert queues[("P0", "llama3-8b")]["depth"] == 2
    assert view["unregistered"] == {"nope.x": [typo]}  # the live worker's app runs sim.run only
    assert queues[("P0", "llama3-8b")]["oldest_wait_s"] >= 0
    assert view["unschedulable"] == 1 and view["unschedulable_ids"] == [big]
    assert view["largest_gpu_gb"] == 35.0
    assert view["stats"] == {"enqueued": 4}
    (worker,) = view["workers"]
    assert set(worker) == {"id", "gpu", "vram_total_gb", "vram_free_gb", "models", "state",
                           "running", "alive", "levels", "handlers", "gpus", "timeouts"}
    assert worker["handlers"] == ["sim.run"]
    assert worker["levels"] == "0123"
    assert worker["id"] == "w-a100" and worker["gpu"] == "A100-40"
    assert worker["vram_total_gb"] == 40 and worker["vram_free_gb"] == 35
    assert worker["running"] == [] and worker["alive"] is True
    assert len(ids) == 2


def test_status_text(cli_pool: Pool) -> None:
    text = cli_pool.ok("status")
    assert f"pool {cli_pool.name}: 0 queued, 0 running" in text
    assert "(no queued tasks)" in text and "(no workers)" in text
    assert text.splitlines()[0].endswith(", 0 workers, no reaper")
    cli_pool.redis.set(cli_pool.keys.reaper_lock, "token", px=60_000)  # as a reaper holds it
    assert cli_pool.ok("status").splitlines()[0].endswith(", 0 workers, a reaper active")
    # producers before any worker: no GPU class known, so no task is larger than one
    first = cli_pool.ok("enqueue", "sim.run", "--model", "m", "--vram-gb", "4").strip()
    assert json.loads(cli_pool.ok("status", "--json"))["unschedulable"] == 0
    assert "unschedulable" not in cli_pool.ok("status") and first in cli_pool.ok("status")
    cli_pool.register_gpu("w-l4", "L4", 24)
    big = cli_pool.ok("enqueue", "sim.run", "--model", "m", "--vram-gb", "40").strip()
    text = cli_pool.ok("status")
    assert "unschedulable: 1 queued task(s)" in text and big in text
    assert "w-l4" in text and "L4" in text


# -- bad input ----------------------------------------------------------------------------

HUGE_PAYLOAD = json.dumps("x" * (1 << 20))

BAD_ENQUEUES: list[tuple[str, list[str], str]] = [
    ("malformed JSON payload", [*BASE, "--payload", '{"prompt": '], "payload is not valid JSON"),
    ("payload not JSON at all", [*BASE, "--payload", "hello"], "payload is not valid JSON"),
    ("NaN payload", [*BASE, "--payload", '{"x": NaN}'], "payload is not JSON-serializable"),
    ("huge payload", [*BASE, "--payload", HUGE_PAYLOAD], "payload is larger than 1048576 bytes"),
    ("unknown priority", [*BASE, "--priority", "P7"], "unknown priority 'P7'"),
    ("unknown priority name", [*BASE, "--priority", "urgent"], "unknown priority 'urgent'"),
    ("negative VRAM", ["h", "--model", "m", "--vram-gb", "-1"], "vram_gb must be a finite number > 0"),
    ("zero VRAM", ["h", "--model", "m", "--vram-gb", "0"], "vram_gb must be a finite number > 0"),
    ("NaN VRAM", ["h", "--model", "m", "--vram-gb", "nan"], "vram_gb must be a finite number > 0"),
    ("infinite VRAM", ["h", "--model", "m", "--vram-gb", "inf"], "vram_gb must be a finite number > 0"),
    ("negative estimate", [*BASE, "--est-s", "-1"], "est_s must be a finite number >= 0"),
    ("NaN estimate", [*BASE, "--est-s", "nan"], "est_s must be a finite number >= 0"),
    ("negative deadline", [*BASE, "--deadline-s", "-5"], "deadline_s must be a finite number > 0"),
    ("zero deadline", [*BASE, "--deadline-s", "0"], "deadline_s must be a finite number > 0"),
    ("zero attempts", [*BASE, "--max-attempts", "0"], "max_attempts must be an integer in 1..100"),
    ("too many attempts", [*BASE, "--max-attempts", "101"], "max_attempts must be an integer in 1..100"),
    ("handler with a space", ["bad handler", "--model", "m", "--vram-gb", "1"], "handler"),
    ("model with braces", ["h", "--model", "m{x}", "--vram-gb", "1"], "model"),
    ("model with a comma", ["h", "--model", "a,b", "--vram-gb", "1"], "model"),
    ("empty tenant", [*BASE, "--tenant", ""], "tenant must be a non-empty string"),
]


@pytest.mark.parametrize("args, fragment", [pytest.param(a, f, id=name) for name, a, f in BAD_ENQUEUES])
def test_bad_enqueue_is_rejected_cleanly_and_writes_nothing(cli_pool: Pool, args: list[str],
                                                            fragment: str) -> None:
    message = assert_clean_error(cli_pool.invoke("enqueue", *args), "invalid task: ", fragment)
    assert len(message) < 300
    assert cli_pool.all_keys() == set()


def test_bad_enqueue_leaves_an_existing_pool_untouched(cli_pool: Pool) -> None:
    good = cli_pool.ok("enqueue", *BASE).strip()
    snapshot = {k: cli_pool.redis.dump(k) for k in cli_pool.all_keys()}
    assert_clean_error(cli_pool.invoke("enqueue", *BASE, "--priority", "P9"))
    assert_clean_error(cli_pool.invoke("enqueue", "h", "--model", "m", "--vram-gb", "0"))
    assert {k: cli_pool.redis.dump(k) for k in cli_pool.all_keys()} == snapshot
    assert json.loads(cli_pool.ok("task", good, "--json"))["state"] == "queued"


@pytest.mark.parametrize("command", ["task", "cancel"])
def test_unknown_task_id(cli_pool: Pool, command: str) -> None:
    assert_clean_error(cli_pool.invoke(command, "no-such-task"), "task no-such-task not found")
    assert cli_pool.all_keys() == set()


@pytest.mark.parametrize("args", [["enqueue", *BASE], ["status"], ["status", "--json"],
                                  ["task", "abc"], ["cancel", "abc"], ["reaper", "--once"],
                                  ["worker", "--app", "workers.sim:app", "--vram-gb", "24"]],
                         ids=lambda a: " ".join(a[:2]))
def test_dead_redis(cli_pool: Pool, args: list[str]) -> None:
    result = cli_pool.invoke(*args, url=DEAD_REDIS)
    assert_clean_error(result, f"cannot reach Redis at {DEAD_REDIS}")


@pytest.mark.parametrize("name", ["a:b{c}", "", "two words"])
def test_bad_pool_name(cli_pool: Pool, name: str) -> None:
    result = CliRunner().invoke(cli, ["--redis", cli_pool.url, "--pool", name, "status"])
    assert_clean_error(result, f"configuration: pool {name!r}")


@pytest.mark.parametrize("url, command", [
    ("notaurl", ["status"]),
    ("http://127.0.0.1:1/0", ["status"]),
    ("redis://127.0.0.1:abc/0", ["status"]),
    ("notaurl", ["enqueue", *BASE]),
], ids=["no scheme", "http scheme", "bad port", "enqueue"])
def test_malformed_redis_url(url: str, command: list[str]) -> None:
    """A malformed --redis URL is bad input like any other: one line, no traceback."""
    result = CliRunner().invoke(cli, ["--redis", url, "--pool", "p", *command])
    assert_clean_error(result, url)


def test_wait_timeout_is_a_clean_error(cli_pool: Pool) -> None:
    result = cli_pool.invoke("enqueue", *BASE, "--wait", "--timeout", "0.3")
    message = assert_clean_error(result, "did not finish within 0.3 s")
    task_id = message.split()[2]
    # the task itself was enqueued and is still there for a worker
    assert json.loads(cli_pool.ok("task", task_id, "--json"))["state"] == "queued"


def test_worker_without_a_gpu_or_a_declared_size(cli_pool: Pool) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver here: the worker must say how to declare a GPU
        result = cli_pool.invoke("worker", "--app", "workers.sim:app")
        assert_clean_error(result, "no NVIDIA GPU found through NVML", "--vram-gb")
        assert cli_pool.all_keys() == set()
        return
    pytest.skip("an NVIDIA GPU is present; a worker would start on it")


@pytest.mark.parametrize("command", ["task", "cancel", "requeue", "drain"])
def test_an_empty_id_is_a_usage_error(cli_pool: Pool, command: str) -> None:
    """Regression: `gpuq task ''` answered "task  not found" (exit 1), as if asked for an id."""
    result = cli_pool.invoke(command, "")
    assert_clean_error(result, "must not be empty")
    assert result.exit_code == 2


def test_a_flag_wins_over_its_bad_variable(cli_pool: Pool) -> None:
    """Regression: GPUQ_POOL= (empty) failed `gpuq --pool p status` ("pool '' must be
    non-empty"): the variables were checked before the flags replaced them. Without the
    flag the empty variable is still refused."""
    assert cli_pool.invoke("status", "--json", env={"GPUQ_POOL": ""}).exit_code == 0
    result = CliRunner().invoke(cli, ["--redis", cli_pool.url, "status"], env={"GPUQ_POOL": ""})
    assert_clean_error(result, "pool '' must be non-empty")
    assert result.exit_code == 2


def test_bad_environment_setting(cli_pool: Pool) -> None:
    result = cli_pool.invoke("status", env={"GPUQ_LEASE_S": "soon"})
    assert_clean_error(result, "GPUQ_LEASE_S='soon' is not a valid float")
    result = cli_pool.invoke("status", env={"GPUQ_HEARTBEAT_S": "60"})
    assert_clean_error(result, "heartbeat_s (60.0) must be > 0 and < lease_s")


@pytest.mark.parametrize("args, fragment", [
    (["--vram-gb", "0"], "--vram-gb must be > 0"),
    (["--vram-gb", "-24"], "--vram-gb must be > 0"),
    (["--vram-gb", "24", "--concurrency", "0"], "concurrency must be >= 1"),
    (["--vram-gb", "24", "--concurrency", "-3"], "concurrency must be >= 1, got -3"),
    (["--app", "workers.sim"], "must look like module:attr"),
    (["--app", "workers.sim:nope"], "app module 'workers.sim' has no 'nope'"),
    (["--app", "no_such_pkg_gpuq:app"], "cannot import app module 'no_such_pkg_gpuq'"),
    # regression: registered a class of -1 GB usable, which --check-fit then misnamed
    (["--vram-gb", "4", "--gpu-count", "2"], "a GPU of 4 GB leaves no room above the KV reserve of 5 GB"),
    # found by a security review: worker:wa:tasks is worker wa's task set
    (["--vram-gb", "24", "--name", "wa:tasks"], "a worker id must be 1..200 printable characters "
                                                "without spaces, commas, braces or colons"),
], ids=["zero vram", "negative vram", "zero concurrency",
     "negative concurrency", "malformed app", "not an app",
        "missing module", "under the kv reserve", "colon in the id"])
def test_worker_bad_options(cli_pool: Pool, args: list[str], fragment: str) -> None:
    if "--app" not in args:
        args = ["--app", "workers.sim:app", *args]
    if "--vram-gb" not in args:
        args = [*args, "--vram-gb", "24"]
    result = cli_pool.invoke("worker", *args)
    assert_clean_error(result, fragment)
    assert result.exit_code == 2  # bad input, an --app that does not load included
    assert cli_pool.all_keys() == set()  # no worker was registered


# -- help ---------------------------------------------------------------------------------

def test_group_help_lists_every_command() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in cli.commands:
        assert name in result.output
    assert {"enqueue", "worker", "reaper", "status", "task", "cancel"} <= set(cli.commands)


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_command_has_help(command: str) -> None:
    # no Redis needed for --help
    result = CliRunner().invoke(cli, ["--redis", DEAD_REDIS, command, "--help"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage: ") and f" {command} [OPTIONS]" in result.stdout
    doc = cli.commands[command].help
    assert doc and " ".join(doc.split()[:6]) in " ".join(result.stdout.split())


def test_usage_errors_exit_2_without_traceback(cli_pool: Pool) -> None:
    result = cli_pool.invoke("enqueue", "sim.run", "--vram-gb", "16")  # --model missing
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr == "Error: Missing option '--model'. (see gpuq enqueue --help)\n"
    result = cli_pool.invoke("enqueue", *BASE, "--vram-gb", "lots")
    assert result.exit_code == 2 and "'lots' is not a valid float" in result.stderr
    assert cli_pool.all_keys() == set()


# -- check-fit ----------------------------------------------------------------------------

def test_check_fit_with_no_registered_class(cli_pool: Pool) -> None:
    assert_clean_error(cli_pool.invoke("enqueue", *BASE, "--check-fit"),
                       "unschedulable: task needs 16 GB of VRAM",
                       "no GPU class is registered in this pool yet")
    assert cli_pool.all_keys() == set()


def test_check_fit_rejects_a_handler_no_worker_registers(cli_pool: Pool) -> None:
    cli_pool.register_gpu("w-l4", "L4", 24)
    before = cli_pool.all_keys()
    assert_clean_error(cli_pool.invoke("enqueue", "nope.x", "--model", "bge-m3", "--vram-gb", "4",
                                       "--check-fit"),
                       "unschedulable: no worker in this pool registers handler 'nope.x'")
    assert cli_pool.all_keys() == before  # nothing written
    cli_pool.ok("enqueue", "sim.run", "--model", "bge-m3", "--vram-gb", "4", "--check-fit")


def test_check_fit_rejects_a_task_larger_than_every_class(cli_pool: Pool) -> None:
    cli_pool.register_gpu("w-l4", "L4", 24)
    cli_pool.register_gpu("w-a6000", "A6000", 48)
    before = cli_pool.all_keys()
    assert_clean_error(
        cli_pool.invoke("enqueue", "sim.run", "--model", "llama3-70b", "--vram-gb", "44",
                        "--check-fit"),
        "unschedulable: task needs 44 GB of VRAM",
        "the largest registered GPU class offers 43 GB")
    assert cli_pool.all_keys() == before  # nothing written
    # fits the largest class exactly; and without --check-fit a too-big task is accepted
    fits = cli_pool.ok("enqueue", "sim.run", "--model", "m", "--vram-gb", "43", "--check-fit")
    later = cli_pool.ok("enqueue", "sim.run", "--model", "m", "--vram-gb", "44")
    assert json.loads(cli_pool.ok("task", fits.strip(), "--json"))["state"] == "queued"
    assert json.loads(cli_pool.ok("task", later.strip(), "--json"))["state"] == "queued"


# -- cancel -------------------------------------------------------------------------------

def test_cancel(cli_pool: Pool) -> None:
    task_id = cli_pool.ok("enqueue", *BASE, "--priority", "P1").strip()
    assert cli_pool.ok("cancel", task_id).strip() == f"canceled {task_id} (was queued)"
    record: dict[str, Any] = json.loads(cli_pool.ok("task", task_id, "--json"))
    assert record["state"] == "canceled" and record["error"] == "canceled"
    assert record["finished_at"] >= record["enqueued_at"]
    assert json.loads(cli_pool.ok("status", "--json"))["queues"] == []
    # a second cancel: the task already ended
    assert_clean_error(cli_pool.invoke("cancel", task_id), f"task {task_id} already ended (canceled)")


def test_cancel_running_task(cli_pool: Pool) -> None:
    from gpuq import Config, Queue
    from gpuq.scripts import ClaimRequest

    task_id = cli_pool.ok("enqueue", *BASE).strip()
    queue = Queue(cli_pool.redis, Config(pool=cli_pool.name, prefix=cli_pool.prefix))
    claimed = queue.scripts.run(queue.calls.claim(ClaimRequest("w1", 75, 0, 1))).task
    assert claimed is not None and claimed["id"] == task_id
    assert cli_pool.ok("cancel", task_id).strip() == f"canceled {task_id} (was running)"
    assert cli_pool.redis.zscore(queue.keys.running, task_id) is None
    assert json.loads(cli_pool.ok("task", task_id, "--json"))["state"] == "canceled"


def test_reaper_once_on_a_quiet_pool(cli_pool: Pool) -> None:
    out = cli_pool.ok("reaper", "--once")
    assert out.strip() == ("requeued 0, failed 0, dead workers 0, retries promoted 0, expired 0, "
                           "parked 0, put back 0, reserved 0, asked to yield 0, scale signals 0, "
                           "warm hints 0, periodic runs 0, tenant bounds changed 0")


@pytest.mark.parametrize("args, message", [
    (("--timeout", "5"), "--timeout needs --wait or --stream"),
    (("--after-any-outcome",), "--after-any-outcome needs --after"),
    (("--wait", "--stream"), "give one of --wait and --stream (--stream prints the result last)")])
def test_an_option_that_would_be_ignored_is_a_usage_error(cli_pool: Pool, args: tuple[str, ...],
                                                         message: str) -> None:
    result = cli_pool.invoke("enqueue", *BASE, *args)
    assert result.exit_code == 2 and result.stderr == f"Error: {message} (see gpuq enqueue --help)\n"
    assert cli_pool.all_keys() == set()  # refused before anything was written
