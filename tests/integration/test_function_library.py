"""The scripts as a function library (gpuq.functions): calls go as FCALL of this version's
library, a server that lost it gets it again, a user who may not load it sends EVALSHA, and
no call sees state an earlier call of the same library left behind."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
import redis
from procs import Procs

from gpuq import acl
from gpuq.call import Call
from gpuq.client import Queue
from gpuq.config import Config
from gpuq.embedded import EmbeddedServer
from gpuq.scripts import ClaimRequest
from gpuq.task import ended_count
from gpuq.wire import spread

T0 = 1_796_000_000_000


def claimed(queue: Queue, n: int) -> list[dict[str, Any]]:
    for i in range(n):
        queue.enqueue("h", {"i": i}, model="m", vram_gb=1)
    out = []
    for _ in range(n):
        task = queue.scripts.run(queue.calls.claim(ClaimRequest("w1", 40.0, 0.0, n), now_ms=T0)).task
        assert task is not None
        out.append(task)
    return out


def script_calls(q: Queue) -> int | None:
    """Script calls the server has run (None where it keeps no command stats)."""
    try:
        stats = q.redis.info("commandstats")
    except redis.ResponseError:
        return None
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha")) or None


def test_calls_are_fcall_of_this_version_s_library(queue: Queue) -> None:
    call = queue.calls.claim(ClaimRequest("w1", 40.0, 0.0, 1))
    command = spread(queue.scripts.command(call))  # its arguments as sent (gpuq.wire.Packed)
    assert command[:2] == ("FCALL", queue.scripts.sender.library.functions["claim"])
    assert command[1].startswith(queue.scripts.sender.library.name + "_")
    assert queue.scripts.run(call).task is None
    assert queue.scripts.sender.fcall


def test_a_server_that_lost_the_library_gets_it_again(queue: Queue) -> None:
    queue.enqueue("h", None, model="m", vram_gb=1)
    queue.redis.execute_command("FUNCTION", "FLUSH")  # as a restart without persistence leaves it
    queue.enqueue("h", None, model="m", vram_gb=1)
    assert queue.redis.zcard(queue.keys.queue(2, "m")) == 2
    assert queue.scripts.sender.fcall


def test_a_flush_between_the_load_and_the_resend_is_loaded_again(queue: Queue,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The defect: a call whose resend found the library flushed again (two flushes in a row)
    raised a bare "Function not found", which workers took for an outage."""
    load, flushes = queue.scripts.load, [2]

    def load_then_lose() -> None:
        load()
        if flushes[0]:
            flushes[0] -= 1
            queue.redis.execute_command("FUNCTION", "FLUSH")
            queue.redis.script_flush()

    monkeypatch.setattr(queue.scripts, "load", load_then_lose)
    queue.redis.execute_command("FUNCTION", "FLUSH")
    queue.redis.script_flush()
    queue.enqueue("h", None, model="m", vram_gb=1)
    assert queue.redis.zcard(queue.keys.queue(2, "m")) == 1 and flushes == [0]


def test_no_call_sees_what_an_earlier_one_left(queue: Queue) -> None:
    """A batch's joined ack leaves lib/tally.lua's state on; the next call of the library
    starts from none (else its counters and set writes would wait for a flush that never
    comes)."""
    one, two, three = claimed(queue, 3)
    acks = [queue.calls.ack(t["id"], int(t["token"]), "1", now_ms=T0 + 10) for t in (one, two)]
    assert [r[0] for r in queue.scripts.pipelined(acks)] == [0, 0]
    queue.scripts.run(queue.calls.ack(three["id"], int(three["token"]), "1", now_ms=T0 + 20))
    assert queue.redis.zcard(queue.keys.running) == 0
    assert ended_count(queue.redis.hgetall(queue.keys.stats), "succeeded") == 3


def test_each_function_answers_as_its_script(queue: Queue) -> None:
    """The same calls, FCALL and EVALSHA in turn: the same replies."""
    sender = queue.scripts.sender

    def both(call: Any) -> list[Any]:
        got = []
        for fcall in (True, False):
            sender.fcall = fcall
            got.append(queue.scripts.run_raw(call))
        sender.fcall = True
        return got

    bad = queue.calls.ack("t1", 1, "null")
    bad.args[2] = "yesterday"  # now: not ms
    e, f = both(bad)
    assert e == f and e[0] == 1
    e, f = both(queue.calls.claim(ClaimRequest("w1", 40.0, 0.0, 1), now_ms=T0))
    assert e == f and e[:2] == [0, "none"]
    for fcall in (True, False):
        sender.fcall = fcall
        (task,) = claimed(queue, 1)
        assert task["payload"] == '{"i":0}'
        queue.scripts.run(queue.calls.ack(task["id"], int(task["token"]), "7", now_ms=T0))
        assert queue.redis.hget(queue.keys.task(task["id"]), "result") == "7"
    sender.fcall = True


@pytest.mark.usefixtures("redis_server")
def test_a_user_who_may_not_load_the_library_sends_evalsha(redis_server: EmbeddedServer, pool: str,
                                                           prefix: str, caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    """A role may call the library's functions but not load them (gpuq.acl): without the
    library on the server its client sends EVALSHA, and works, and says so once."""
    admin = redis.Redis.from_url(redis_server.url, decode_responses=True)
    user, password = f"gpuq-test-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    try:
        admin.execute_command("ACL", "SETUSER", user, "reset", "on", f">{password}",
                              *acl.rules("producer", pool, prefix))
        admin.execute_command("FUNCTION", "FLUSH")
        client = redis.Redis.from_url(redis_server.url, username=user, password=password,
                                      decode_responses=True)
        q = Queue(client, Config(pool=pool, prefix=prefix).validate())
        with caplog.at_level(logging.WARNING, logger="gpuq.functions"):
            q.enqueue("h", None, model="m", vram_gb=1)
            q.enqueue("h", None, model="m", vram_gb=1)
        assert not q.scripts.sender.fcall
        (said,) = [r.getMessage() for r in caplog.records if "scripts.evalsha" in r.getMessage()]
        assert "function|load" in said, said
        assert spread(q.scripts.command(q.calls.claim(ClaimRequest("w1", 40.0, 0.0, 1))))[0] == "EVALSHA"
        assert admin.zcard(q.keys.queue(2, "m")) == 2
        client.close()
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


def test_load_functions_loads_this_version_s_library(procs: Procs) -> None:
    procs.redis.execute_command("FUNCTION", "FLUSH")
    name = procs.run_cli("load-functions").strip()
    assert name.startswith("gpuq_")
    listed = procs.redis.execute_command("FUNCTION", "LIST", "LIBRARYNAME", name)
    assert len(listed) == 1
    assert procs.run_cli("load-functions").strip() == name  # loaded already: the same answer


def test_load_functions_against_a_dead_redis_is_one_line() -> None:
    from click.testing import CliRunner

    from gpuq.cli import cli

    result = CliRunner().invoke(cli, ["--redis", "redis://127.0.0.1:1/0", "load-functions"])
    assert result.exit_code != 0
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_acks_and_the_claim_after_them_go_as_one_call_either_way(queue: Queue) -> None:
    """A worker's acks ride with its next claim as one call (gpuq/joined.py): FCALL of the
    joined function or EVALSHA of its own source; each part answers as it would alone, a
    stale ack included, and one clock read stamps the ack's end and the claim's start."""
    sender = queue.scripts.sender
    for fcall in (True, False):
        sender.fcall = fcall
        one, two = claimed(queue, 2)
        ids = [queue.enqueue("h", {"i": i}, model="m", vram_gb=1).id for i in range(2)]
        calls = [queue.calls.ack(one["id"], int(one["token"]), "1"),
                 queue.calls.ack(two["id"], int(two["token"]) + 1, "2"),  # a stale token
                 queue.calls.claim(ClaimRequest("w1", 40.0, 0.0, 1))]
        assert [spread(queue.scripts.command(c))[0] for c in calls] == ["FCALL" if fcall else "EVALSHA"] * 3
        before = script_calls(queue)
        acked, stale, reply = queue.scripts.pipelined(calls)
        if before is not None:  # a server that keeps command stats: one script call
            assert script_calls(queue) == before + 1
        assert acked == [0] and stale == [5, "running"]
        task = calls[2].parse(reply).task
        assert task is not None and task["id"] == ids[0]
        finished = queue.redis.hget(queue.keys.task(one["id"]), "finished_at")
        assert finished == task["started_at"]  # the same clock read
        assert queue.redis.hget(queue.keys.task(two["id"]), "state") == "running"
        for t in (two, task):  # leave nothing running for the next round
            queue.scripts.run(queue.calls.ack(t["id"], int(t["token"]), "3"))
        queue.redis.delete(queue.keys.queue(2, "m"), queue.keys.models_with_work)
    sender.fcall = True


def test_a_joined_call_with_a_malformed_count_runs_neither_part(queue: Queue) -> None:
    (one,) = claimed(queue, 1)
    ack = queue.calls.ack(one["id"], int(one["token"]), "1")
    for count in ("x", "-1", "99", "1.5"):
        for fcall in (True, False):
            queue.scripts.sender.fcall = fcall
            call = Call("ack_claim", [count, *ack.args, "w1"], lambda r: r)
            assert queue.scripts.run_raw(call) == [1, 0, "the first argument must count the "
                                                   "arguments of the first part"]
    queue.scripts.sender.fcall = True
    assert queue.redis.hget(queue.keys.task(one["id"]), "state") == "running"


def test_a_server_that_lost_the_library_runs_a_joined_call_once_loaded(queue: Queue) -> None:
    (one,) = claimed(queue, 1)
    queue.redis.execute_command("FUNCTION", "FLUSH")
    acked, reply = queue.scripts.pipelined([queue.calls.ack(one["id"], int(one["token"]), "1"),
                                            queue.calls.claim(ClaimRequest("w1", 40.0, 0.0, 1))])
    assert acked == [0] and reply[:2] == [0, "none"]
    assert ended_count(queue.redis.hgetall(queue.keys.stats), "succeeded") == 1
