"""The CLI's task commands with hostile options and payloads (hypothesis), against the suite's
real server through click's CliRunner.

Each invocation either succeeds (enqueue prints the id of a task now queued with what was
asked) or exits non-zero with one line "Error: ..." on stderr (usage errors too, exit 2) and
nothing on stdout: never a traceback, and the pool
exactly as it was. Payloads: invalid JSON, NaN and Infinity, past the 1 MiB limit, deeper
than the parser nests, text with lone surrogates (bytes that are not UTF-8, as Python's
surrogateescape hands them over). GPUQ_FUZZ_EXAMPLES=N runs N examples per test.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from gpuq.cli import cli
from gpuq.embedded import EmbeddedServer
from gpuq.keys import Keys
from gpuq.task import MAX_PAYLOAD_BYTES

EXAMPLES = int(os.environ.get("GPUQ_FUZZ_EXAMPLES", "0"))
SETTINGS: dict[str, Any] = dict(
    deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.large_base_example])


class Pool:
    """A fresh pool per example on the suite's server, with a queued and a finished task."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.redis = redis.Redis.from_url(url)
        self.keys = Keys("x", prefix)

    def fresh(self) -> dict[str, str]:
        """A new pool name, with a queued and a canceled task: their ids by "@queued" and
        "@done"."""
        self.keys = Keys(f"c{uuid.uuid4().hex[:10]}", self.prefix)
        ids = [self.invoke("enqueue", "h", "--model", "A", "--vram-gb", "1")[1].stdout.strip()
               for _ in range(2)]
        assert self.invoke("cancel", ids[1])[0] == 0
        return {"@queued": ids[0], "@done": ids[1]}

    def invoke(self, *args: str) -> tuple[int, Result]:
        result = CliRunner().invoke(cli, ["--redis", self.url, "--pool", self.keys.pool, *args],
                                    env={"GPUQ_PREFIX": self.prefix})
        return result.exit_code, result

    def snapshot(self) -> dict[bytes, tuple[Any, Any]]:
        names = sorted(self.redis.scan_iter(match=self.keys.pattern, count=1000))
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.dump(name)
            pipe.execute_command("PEXPIRETIME", name)
        got = pipe.execute()
        return {n: (got[2 * i], got[2 * i + 1]) for i, n in enumerate(names)}

    def clear(self) -> None:
        names = list(self.redis.scan_iter(match=self.keys.pattern, count=1000))
        if names:
            self.redis.delete(*names)


@pytest.fixture(scope="module")
def pool(redis_server: EmbeddedServer, prefix: str) -> Iterator[Pool]:
    p = Pool(redis_server.url, prefix)
    yield p
    p.redis.close()
    print(f"\nCLI invocations: {sum(v for k, v in RAN.items() if k != 'enqueued')} ({RAN})")


RAN: dict[str, int] = {}


def run(pool: Pool, *given: str, succeeded: Callable[[Result], None] | None = None) -> Result:
    """Invoke on a fresh pool (with "@queued" and "@done" standing for its tasks' ids); check
    the outcome is a success (then checked by `succeeded`) or one clean error with the pool
    unchanged."""
    RAN[given[0]] = RAN.get(given[0], 0) + 1
    ids = pool.fresh()
    args = [ids.get(a, a) for a in given]
    try:
        before = pool.snapshot()
        code, result = pool.invoke(*args)
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            f"{args[:12]!r} raised {result.exception!r}")
        assert "Traceback" not in result.output
        if code != 0:
            lines = result.stderr.strip("\n").split("\n")  # as a terminal shows them
            assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
            assert result.stdout == "", result.stdout
            assert pool.snapshot() == before, f"{args[:12]!r} failed but wrote"
        elif succeeded is not None:
            succeeded(result)
        return result
    finally:
        pool.clear()


def mostly(valid: list[str], hostile: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A valid value two times in three, so that the other options are reached too."""
    return st.one_of(st.sampled_from(valid), st.sampled_from(valid), hostile)


NUMBER_TEXT = st.one_of(
    st.sampled_from(["0", "-0", "1", "-1", "0.5", "16", "80", "1e10", "1e11", "1e300", "1e309", "-1e309",
                     "nan", "NaN", "inf", "-inf", "Infinity", "0x10", " 5", "5 ", "", "abc", "1,5", "٣",
                     "100", "101", "3", "9999999999999999999999"]),
    st.floats().map(repr),
    st.integers(-(2 ** 70), 2 ** 70).map(str),
)
NAME_TEXT = st.one_of(
    st.sampled_from(["A", "llama3-8b", "h", "sim.run", "", " ", "a b", "a,b", "{x}", "x" * 201, "x" * 200,
                     "%", "[", ".*", "\udcff", "a\udc80b", "é", "\x00", "-", "--model", "rq.job"]),
    st.text(max_size=12),
)
DEEP = "[" * 100_000 + "]" * 100_000
PAYLOAD_TEXT = st.one_of(
    st.sampled_from(["null", "{}", "[]", '"x"', "1", "NaN", "Infinity", "-Infinity", '{"a": NaN}', "[1e400]",
                     "{", "[", "", " ", "nul", "'x'", '{"a":1,}', "\udcff", '"\udcff"', '"\\udcff"',
                     '"\\ud800"', "[" * 1000 + "]" * 1000, DEEP, '"' + "a" * MAX_PAYLOAD_BYTES + '"',
                     '"' + "a" * (MAX_PAYLOAD_BYTES - 2) + '"', '{"\\u0000": 1}', "0x10", "1" * 5000]),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                 lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                              max_size=4),
                 max_leaves=12).map(json.dumps),
    st.text(max_size=30),
)
PRIORITY_TEXT = st.one_of(st.sampled_from(["P0", "p1", "2", "3", "online", "BATCH", "P4", "-1", "", "nan",
                                           "P0 ", " online"]), st.text(max_size=6))


@st.composite
def enqueue_args(draw: st.DrawFn) -> list[str]:
    names = ["A", "llama3-8b", "sim.run", "t-1"]
    args = ["enqueue", draw(mostly(names, NAME_TEXT))]
    options = {"--payload": PAYLOAD_TEXT, "--model": mostly(names, NAME_TEXT),
               "--vram-gb": mostly(["1", "16", "0.5"], NUMBER_TEXT),
               "--priority": mostly(["P0", "batch", "3"], PRIORITY_TEXT),
               "--est-s": mostly(["0", "2.5"], NUMBER_TEXT), "--deadline-s": mostly(["5", "60"], NUMBER_TEXT),
               "--max-attempts": mostly(["1", "100"], NUMBER_TEXT), "--tenant": mostly(names, NAME_TEXT)}
    for option, values in options.items():
        # --model and --vram-gb are required: usually given, so that the others are reached
        if draw(st.integers(0, 9)) < (9 if option in ("--model", "--vram-gb") else 5):
            args += [option, draw(values)]
    if draw(st.booleans()):
        args.append("--no-preempt")
    if draw(st.integers(0, 9)) == 0:
        args.append("--check-fit")
    return args


@settings(max_examples=EXAMPLES or 150, **SETTINGS)
@given(args=enqueue_args())
@example(args=["enqueue", "h", "--model", "A", "--vram-gb", "1", "--payload", DEEP])
@example(args=["enqueue", "h", "--model", "A", "--vram-gb", "1", "--payload", '"\udcff"'])
@example(args=["enqueue", "h", "--model", "A", "--vram-gb", "1", "--est-s", "1e300", "--deadline-s", "5"])
def test_enqueue_succeeds_or_says_why_in_one_line(pool: Pool, args: list[str]) -> None:
    def queued(result: Result) -> None:
        RAN["enqueued"] = RAN.get("enqueued", 0) + 1
        task_id = result.stdout.strip()
        code, shown = pool.invoke("task", task_id, "--json")  # stored as `gpuq task` reads it
        assert code == 0 and json.loads(shown.stdout)["state"] == "queued", shown.output

    run(pool, *args, succeeded=queued)


IDS = st.one_of(st.sampled_from(["@queued", "@done", "nope", "", " ", "a b", "{x}", "x" * 201, "%", "*",
                                 "\udcff", "a\udc80", "-", "--json", "\x00", "a\nb", "\x1e"]),
                st.text(max_size=16))


@settings(max_examples=EXAMPLES or 40, **SETTINGS)
@given(command=st.sampled_from(["task", "cancel", "requeue"]), task_id=IDS, as_json=st.booleans())
def test_task_commands_succeed_or_say_why_in_one_line(pool: Pool, command: str, task_id: str,
                                                      as_json: bool) -> None:
    args = [command, task_id, *(["--json"] if command == "task" and as_json else [])]
    run(pool, *args)


def test_a_choice_list_in_a_usage_error_stays_one_readable_line() -> None:
    """Regression: click lays a missing choice's options out on indented lines, which the one
    line showed as literal \\n\\t escapes."""
    result = CliRunner().invoke(cli, ["acl", "--password-env", "X"])
    assert result.exit_code == 2
    assert result.output.strip() == ("Error: Missing option '--role'. Choose from: producer, worker, reaper, "
                                     "operator, observer (see gpuq acl --help)")
