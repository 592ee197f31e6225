"""The CLI's exit codes (gpuq.cli.base.Exit, README's CLI section): a script can tell a task
that ended badly from a wait that timed out, an unreachable Redis and bad input.

Found by an audit: `gpuq enqueue --wait` exited 1 for all four (click's usage errors alone
exited 2)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import claim, fail
from test_cli import BASE, DEAD_REDIS, Pool, assert_clean_error

from gpuq import Config, Queue
from gpuq.cli import tasks
from gpuq.cli.base import Exit, failure_of
from gpuq.embedded import EmbeddedServer
from gpuq.errors import AuthenticationFailed, ConnectionFailed, NoMaster, ServerRefused, TlsFailed


@pytest.fixture
def cli_pool(redis_server: EmbeddedServer, pool: str, prefix: str) -> Iterator[Pool]:
    p = Pool(redis_server.url, pool, prefix)
    yield p
    p.redis.close()


def ended_while_waiting(p: Pool, end: Callable[[Queue, str], None], *args: str) -> str:
    """`gpuq enqueue ... --wait` while another thread ends the task as soon as it is stored;
    the waiting command's one error line."""
    q = Queue(p.redis, Config(pool=p.name, prefix=p.prefix).validate())
    queue_key = q.keys.queue(2, "llama3-8b")
    stop = threading.Event()

    def ender() -> None:
        while not stop.wait(0.02):
            if ids := p.redis.zrange(queue_key, 0, 0):
                end(q, ids[0])
                return

    thread = threading.Thread(target=ender)
    thread.start()
    try:
        result = p.invoke("enqueue", *BASE, "--max-attempts", "1", *args, "--wait", "--timeout", "60")
    finally:
        stop.set()
        thread.join()
    line = assert_clean_error(result)
    assert result.exit_code == Exit.NOT_DONE == 3, line
    return line


def fail_it(q: Queue, task_id: str) -> None:
    c = claim(q, "w1", 40)
    assert c is not None and c["id"] == task_id
    assert fail(q, task_id, c["token"], "RuntimeError: bad prompt", retry=False) == "failed"


def test_a_waited_task_that_failed_exits_3(cli_pool: Pool) -> None:
    assert "failed: RuntimeError: bad prompt" in ended_while_waiting(cli_pool, fail_it)


def test_a_waited_task_that_was_canceled_exits_3(cli_pool: Pool) -> None:
    def cancel_it(q: Queue, task_id: str) -> None:
        q.cancel(task_id)

    assert " canceled" in ended_while_waiting(cli_pool, cancel_it)


@pytest.mark.parametrize("how", ["--wait", "--stream"])
def test_a_wait_that_timed_out_exits_4(cli_pool: Pool, how: str) -> None:
    result = cli_pool.invoke("enqueue", *BASE, how, "--timeout", "0.2")
    assert_clean_error(result, "did not finish within 0.2 s")
    assert result.exit_code == Exit.TIMED_OUT == 4


@pytest.mark.parametrize("args", [["enqueue", *BASE, "--wait"], ["status"], ["failures"]],
                         ids=lambda a: a[0])
def test_an_unreachable_redis_exits_5(cli_pool: Pool, args: list[str]) -> None:
    result = cli_pool.invoke(*args, url=DEAD_REDIS)
    assert_clean_error(result, f"cannot reach Redis at {DEAD_REDIS}")
    assert result.exit_code == Exit.NO_REDIS == 5


@pytest.mark.parametrize("flags", [[], ["--json"]], ids=["text", "json"])
def test_a_redis_that_dies_mid_command_exits_5(monkeypatch: pytest.MonkeyPatch, pool: str, prefix: str,
                                               flags: list[str]) -> None:
    """Regression: `gpuq task` read the task's children and its parked and handed marks outside
    the error boundary: a Redis that died after the task's hash was read ended it in a
    traceback (exit 1). The server is killed once the hash has been read."""
    server = EmbeddedServer("redis").start()
    try:
        p = Pool(server.url, pool, prefix)
        task_id = p.ok("enqueue", *BASE).strip()
        p.redis.close()
        children = tasks.task_children

        def after_a_kill(*args: Any) -> Any:
            server.stop()
            return children(*args)

        monkeypatch.setattr(tasks, "task_children", after_a_kill)
        result = p.invoke("task", task_id, *flags)
    finally:
        server.stop()
    assert_clean_error(result, f"cannot reach Redis at {server.url}")
    assert result.exit_code == Exit.NO_REDIS == 5


@pytest.mark.parametrize("kind", [ConnectionFailed, AuthenticationFailed, TlsFailed, NoMaster,
                                  ServerRefused])
def test_every_kind_of_redis_that_cannot_be_used_exits_5(kind: type[ConnectionFailed]) -> None:
    assert failure_of(kind("redis://:pw@h:1/0", "why")).exit_code == Exit.NO_REDIS


@pytest.mark.parametrize("args, env", [
    (["enqueue", *BASE, "--payload", "{"], {}),  # an invalid task
    (["enqueue", *BASE, "--wait", "--timeout", "-1"], {}),  # an invalid option value
    (["status"], {"GPUQ_LEASE_S": "soon"}),  # an invalid setting
    (["enqueue", *BASE, "--timeout", "1"], {}),  # a usage error (click's)
    # regression: a malformed tenant or schedule exited 1, as an unknown one does
    (["tenant", "set", "x", "--weight", "-1"], {}),
    (["tenant", "set", "x y"], {}),
    (["schedule", "add", "s", "sim.run", "--model", "m", "--vram-gb", "1", "--cron", "bad"], {}),
    (["schedule", "add", "s", "sim.run", "--model", "m", "--vram-gb", "1", "--every", "9" * 400], {}),
], ids=["task", "option", "setting", "usage", "tenant weight", "tenant name", "cron", "every"])
def test_bad_input_exits_2_and_writes_nothing(cli_pool: Pool, args: list[str], env: dict[str, str]) -> None:
    result = cli_pool.invoke(*args, env=env)
    assert_clean_error(result)
    assert result.exit_code == Exit.BAD_INPUT == 2
    assert cli_pool.all_keys() == set()


def test_a_task_check_fit_refuses_exits_2_and_writes_nothing(cli_pool: Pool) -> None:
    # regression: a refusal exited 1, as a failure that is not the input's
    fit = ["--check-fit"]
    none_yet = cli_pool.invoke("enqueue", *BASE, *fit)
    assert_clean_error(none_yet, "no GPU class is registered in this pool yet")
    assert none_yet.exit_code == Exit.BAD_INPUT
    cli_pool.register_gpu("w-l4", "L4", 24)
    before = cli_pool.all_keys()
    for args, fragment in [(["sim.run", "--model", "m", "--vram-gb", "40"], "needs 40 GB of VRAM"),
                           (["nope.x", "--model", "m", "--vram-gb", "4"], "registers handler 'nope.x'")]:
        result = cli_pool.invoke("enqueue", *args, *fit)
        assert_clean_error(result, fragment)
        assert result.exit_code == Exit.BAD_INPUT == 2
    assert cli_pool.all_keys() == before


def test_other_failures_exit_1(cli_pool: Pool) -> None:
    result = cli_pool.invoke("task", "no-such-task")
    assert_clean_error(result, "task no-such-task not found")
    assert result.exit_code == Exit.ERROR == 1
    unknown = cli_pool.invoke("schedule", "remove", "no-such-schedule")  # known only to the pool
    assert_clean_error(unknown, "no schedule named")
    assert unknown.exit_code == Exit.ERROR
    gone = cli_pool.invoke("tenant", "rm", "no-such-tenant")  # nothing to remove: not the input's fault
    assert_clean_error(gone, "tenant 'no-such-tenant' is not registered")
    assert gone.exit_code == Exit.ERROR


@pytest.mark.parametrize("args, fragment", [
    (["--tenant", "ghost"], "invalid task: tenant ghost is not registered (this pool requires it"),
    (["--tenant", "alice", "--payload", '{"a": '], "invalid task: payload is not valid JSON"),
    (["--tenant", "alice", "--priority", "P9"], "invalid task: unknown priority 'P9'"),
    (["--tenant", "alice", "--vram-gb", "-1"], "invalid task: vram_gb must be a finite number > 0"),
    (["--tenant", "alice", "--payload", json.dumps("x" * (1 << 20))], "payload is larger than 1048576 bytes"),
    (["--tenant", "alice", "--vram-gb", "2e6"], "vram_gb must be a finite number > 0 and at most 1e6"),
], ids=["unknown tenant", "malformed JSON", "unknown priority", "negative VRAM", "oversized payload",
        "oversized VRAM"])
def test_an_enqueue_refused_for_its_input_exits_2_and_writes_no_task(cli_pool: Pool, args: list[str],
                                                                      fragment: str) -> None:
    """Audit: every refusal of a task's own input, a tenant the pool does not know (tenants
    required) included, is one line and exit 2, as click's usage errors are."""
    cli_pool.ok("tenant", "set", "alice")
    cli_pool.ok("tenant", "require", "on")
    before = cli_pool.all_keys()
    result = cli_pool.invoke("enqueue", "sim.run", "--model", "m", "--vram-gb", "4", *args)
    assert_clean_error(result, fragment)
    assert result.exit_code == Exit.BAD_INPUT == 2
    assert cli_pool.all_keys() == before


@pytest.mark.parametrize("args", [["--max-gpus", "-1"], ["--max-vram-gb", "nan"], ["--weight", "inf"],
                                  ["--max-gpus", "1e3"]], ids=["gpus", "vram", "weight", "not an integer"])
def test_a_tenant_setting_refused_exits_2_and_writes_nothing(cli_pool: Pool, args: list[str]) -> None:
    result = cli_pool.invoke("tenant", "set", "x", *args)
    assert_clean_error(result)
    assert result.exit_code == Exit.BAD_INPUT == 2
    assert cli_pool.all_keys() == set()


def test_a_tenant_set_without_a_weight_keeps_the_one_it_had(cli_pool: Pool) -> None:
    """Found by a QA pass: `tenant set A --max-gpus 1` on a tenant of weight 3 reset its
    weight to 1 (the option's default), which its help did not say."""
    said = cli_pool.ok("tenant", "set", "a", "--weight", "3").strip()
    assert said == "registered a: weight 3, max_gpus -, max_vram_gb -"
    said = cli_pool.ok("tenant", "set", "a", "--max-gpus", "1").strip()
    assert said == "changed a: weight 3, max_gpus 1, max_vram_gb -"
    said = cli_pool.ok("tenant", "set", "b", "--max-gpus", "2").strip()
    assert said == "registered b: weight 1, max_gpus 2, max_vram_gb -"


def test_a_schedule_of_a_tenant_not_registered_exits_2_as_its_enqueue_would(cli_pool: Pool) -> None:
    """Regression: `gpuq schedule add --tenant T` for a tenant the pool does not know (tenants
    required) exited 1, while `gpuq enqueue --tenant T` of the same task exits 2 (bad input)."""
    cli_pool.ok("tenant", "set", "alice")
    cli_pool.ok("tenant", "require", "on")
    before = cli_pool.all_keys()
    result = cli_pool.invoke("schedule", "add", "s", *BASE, "--tenant", "ghost", "--every", "60")
    assert_clean_error(result, "tenant ghost is not registered (this pool requires it")
    assert result.exit_code == Exit.BAD_INPUT == 2
    assert cli_pool.all_keys() == before


def test_ctrl_c_in_a_command_exits_130(cli_pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a QA pass: Ctrl-C in `gpuq simulate` printed click's "Aborted!" and exited 1,
    an error's code; a shell's convention for SIGINT is 130."""
    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("gpuq.cli.tenants.read", interrupted)
    result = cli_pool.invoke("tenant", "list")
    assert result.exit_code == 130 and result.output.strip() == "interrupted"


def test_tenant_list_says_what_an_uncounted_running_column_means(cli_pool: Pool) -> None:
    """Found by a QA pass: an uncapped tenant's RUNNING read "-" while its task ran, which the
    list did not explain (use is counted only where a limit needs it)."""
    cli_pool.ok("tenant", "set", "free")
    cli_pool.ok("tenant", "set", "capped", "--max-gpus", "2")
    out = cli_pool.ok("tenant", "list")
    assert "RUNNING, GPUS, VRAM: counted for tenants with a cap or a bound only (-: not counted)" in out
    assert [line.split()[5] for line in out.splitlines()[1:3]] == ["0", "-"]  # capped, free
