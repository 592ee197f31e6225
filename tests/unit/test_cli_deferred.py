"""The CLI of delayed tasks, dependencies and periodic tasks: options reach the task, bad
input is one line and a non-zero exit with nothing stored."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from test_cli import BASE, Pool, assert_clean_error

from gpuq.embedded import EmbeddedServer


@pytest.fixture
def cli_pool(redis_server: EmbeddedServer, pool: str, prefix: str) -> Iterator[Pool]:
    p = Pool(redis_server.url, pool, prefix)
    yield p
    p.redis.close()


def test_enqueue_with_a_delay_and_after(cli_pool: Pool) -> None:
    later = cli_pool.ok("enqueue", *BASE, "--delay-s", "60").strip()
    record = json.loads(cli_pool.ok("task", later, "--json"))
    assert record["state"] == "delayed" and record["due_at"] > time.time() + 50
    child = cli_pool.ok("enqueue", *BASE, "--after", later, "--after-any-outcome").strip()
    record = json.loads(cli_pool.ok("task", child, "--json"))
    assert record["state"] == "waiting" and record["parents"] == [later]
    assert json.loads(cli_pool.ok("task", later, "--json"))["children"] == [child]
    status = json.loads(cli_pool.ok("status", "--json"))
    assert (status["delayed"], status["waiting"]) == (1, 1)
    assert "1 delayed, 1 waiting for parents" in cli_pool.ok("status")


@pytest.mark.parametrize("args, fragment", [
    (["--delay-s", "5", "--at", "2000000000"], "not both"),
    (["--delay-s", "-1"], "delay_s must be a finite number >= 0"),
    (["--at", "1000"], "at is in the past"),
    (["--after", "nosuch"], "unknown parent task nosuch"),
    (["--after", "x", "--delay-s", "1"], "after cannot be combined"),
])
def test_bad_deferrals_are_one_line(cli_pool: Pool, args: list[str], fragment: str) -> None:
    assert_clean_error(cli_pool.invoke("enqueue", *BASE, *args), fragment)
    assert cli_pool.all_keys() == set()


def test_schedule_add_list_remove(cli_pool: Pool) -> None:
    out = cli_pool.ok("schedule", "add", "nightly", "--cron", "0 3 * * *", "--skip-missed", "--",
                      *BASE, "--priority", "batch", "--payload", '{"k": 1}')
    assert out.startswith("added nightly: first run at ")
    cli_pool.ok("schedule", "add", "often", "--every", "10m", "sim.run", "--model", "m",
                "--vram-gb", "1")
    (nightly, often) = json.loads(cli_pool.ok("schedule", "list", "--json"))
    assert (nightly["name"], nightly["cron"], nightly["skip_missed"]) == ("nightly", "0 3 * * *", True)
    assert nightly["task"]["priority"] == 2 and nightly["task"]["payload"] == {"k": 1}
    assert often["task"]["payload"] is None  # JSON, as `gpuq task --json` shows a payload
    assert often["every_s"] == 600 and often["next_period"] > time.time() + 590
    assert "often: every 10m" in cli_pool.ok("schedule", "list")  # as --every takes it, not 600s
    assert cli_pool.ok("schedule", "remove", "often").strip() == "removed often"
    assert [s["name"] for s in json.loads(cli_pool.ok("schedule", "list", "--json"))] == ["nightly"]
    assert "1 schedules" in cli_pool.ok("status")


@pytest.mark.parametrize("args, fragment", [
    (["s", "--every", "0.5s", "--", *BASE], "at least 1 s"),
    (["s", "--every", "soon", "--", *BASE], "expected a number and a unit"),
    (["s", "--cron", "0 3 * *", "--", *BASE], "expected 5 fields"),
    (["s", "--cron", "0 25 * * *", "--", *BASE], "hour field"),
    (["s", "--cron", "0 0 31 2 *", "--", *BASE], "never fires"),
    (["s", "--", *BASE], "give one of every and cron"),
    (["s", "--every", "1m", "--cron", "* * * * *", "--", *BASE], "give one of every and cron"),
    (["bad name", "--every", "1m", "--", *BASE], "name 'bad name'"),
    (["s", "--every", "1m", "--", *BASE, "--priority", "soon"], "unknown priority"),
    (["s", "--every", "1m", "--", *BASE, "--payload", "{"], "payload is not valid JSON"),
])
def test_bad_schedules_are_one_line_and_store_nothing(cli_pool: Pool, args: list[str],
                                                      fragment: str) -> None:
    assert_clean_error(cli_pool.invoke("schedule", "add", *args), fragment)
    assert cli_pool.all_keys() == set()


def test_a_task_part_missing_an_option_is_a_usage_error(cli_pool: Pool) -> None:
    result = cli_pool.invoke("schedule", "add", "s", "--every", "1m", "--", "sim.run")
    assert result.exit_code == 2 and "Error: Missing option '--model'" in result.stderr
    assert "Traceback" not in result.output and cli_pool.all_keys() == set()


def test_remove_of_an_unknown_schedule_is_one_line(cli_pool: Pool) -> None:
    assert_clean_error(cli_pool.invoke("schedule", "remove", "nope"), "no schedule named 'nope'")
