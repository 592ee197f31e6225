"""Finding failed tasks from the CLI: `gpuq status` counts the ended tasks by state, and
`gpuq failures` lists the latest that ended failed (text and --json), from the pool's
`failures` list (lib/failures.lua)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from helpers import claim, fail
from test_cli import BASE, Pool

from gpuq import Config, Queue
from gpuq.embedded import EmbeddedServer


@pytest.fixture
def cli_pool(redis_server: EmbeddedServer, pool: str, prefix: str) -> Iterator[Pool]:
    p = Pool(redis_server.url, pool, prefix)
    yield p
    p.redis.close()


def failed_task(p: Pool, *options: str, error: str = "RuntimeError: bad prompt") -> str:
    """A task enqueued through the CLI, then claimed and failed for good as a worker would."""
    task_id = p.ok("enqueue", *BASE, "--max-attempts", "1", *options).strip()
    q = Queue(p.redis, Config(pool=p.name, prefix=p.prefix).validate())
    c = claim(q, "w1", 40)
    assert c is not None and c["id"] == task_id
    assert fail(q, task_id, c["token"], error, retry=False) == "failed"
    return task_id


def test_status_text_counts_the_ended_tasks_by_state(cli_pool: Pool) -> None:
    """Found by an audit: the text showed no succeeded or failed counts (only --json's stats)."""
    (ended,) = [line for line in cli_pool.ok("status").splitlines() if line.startswith("ended:")]
    assert ended == "ended: 0 succeeded, 0 failed, 0 expired, 0 canceled"
    failed_task(cli_pool)
    cli_pool.ok("cancel", cli_pool.ok("enqueue", *BASE).strip())
    (ended,) = [line for line in cli_pool.ok("status").splitlines() if line.startswith("ended:")]
    assert ended == "ended: 0 succeeded, 1 failed, 0 expired, 1 canceled (the latest: gpuq failures)"


def test_failures_lists_the_latest_failed_tasks(cli_pool: Pool) -> None:
    """Found by an audit: a failed task's id appeared only in worker logs."""
    assert cli_pool.ok("failures") == "(no failed tasks recorded)\n"
    assert json.loads(cli_pool.ok("failures", "--json")) == []
    first = failed_task(cli_pool, "--tenant", "shop", "--priority", "P1")
    second = failed_task(cli_pool, error="oom\x1b[2J" + "x" * 300)
    entries = json.loads(cli_pool.ok("failures", "--json"))
    assert [e["id"] for e in entries] == [second, first]  # newest first
    assert {k: entries[1][k] for k in ("handler", "model", "priority", "tenant", "attempt", "error")} == {
        "handler": "sim.run", "model": "llama3-8b", "priority": "P1", "tenant": "shop", "attempt": 1,
        "error": "RuntimeError: bad prompt"}
    assert len(entries[0]["error"]) == 200 and isinstance(entries[0]["at"], float)
    header, newest, older = cli_pool.ok("failures").splitlines()
    assert header.split() == ["FAILED", "AT", "(UTC)", "PRI", "TASK", "HANDLER", "MODEL", "TENANT",
                              "TRY", "ERROR"]
    assert older.split()[2:] == ["P1", first, "sim.run", "llama3-8b", "shop", "1", "RuntimeError:",
                                 "bad", "prompt"]
    assert second in newest and "oom\\x1b[2J" in newest  # no terminal escape reaches the screen
    assert [e["id"] for e in json.loads(cli_pool.ok("failures", "--limit", "1", "--json"))] == [second]


def test_failures_skips_what_does_not_parse_and_refuses_a_bad_limit(cli_pool: Pool) -> None:
    cli_pool.redis.lpush(cli_pool.keys.failures, "not json", "[1]", json.dumps({"id": "x", "at": "soon"}))
    (line,) = cli_pool.ok("failures").splitlines()[1:]
    assert line.split()[:2] == ["?", "x"]
    result = cli_pool.invoke("failures", "--limit", "0")
    assert result.exit_code == 2 and "--limit" in result.stderr


def test_a_failure_on_a_whole_second_still_has_a_float_time(cli_pool: Pool) -> None:
    """Regression: the script's JSON writes a whole second as an integer, so `at` in --json was
    an int about once in a thousand failures (a flaky check of its type)."""
    cli_pool.redis.lpush(cli_pool.keys.failures, json.dumps({"id": "x", "at": 1796420808}))
    (entry,) = json.loads(cli_pool.ok("failures", "--json"))
    assert entry["at"] == 1796420808.0 and isinstance(entry["at"], float)
