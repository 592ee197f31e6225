"""gpuq.wire's packing: a command ending with arguments packed once sends the same bytes."""

from __future__ import annotations

import gc

import hiredis
import redis
from redis.connection import PythonRespSerializer

from gpuq.claims import ClaimRequest
from gpuq.config import Config
from gpuq.joined import carried, joined_acks
from gpuq.keys import Keys
from gpuq.scripts import Call, Calls, Scripts
from gpuq.wire import Packed, Tail, _kept_for, pack


def connection(python_packer: bool = False) -> redis.Connection:
    conn = redis.Redis(host="127.0.0.1", port=1).connection_pool.make_connection()
    if python_packer:  # as where hiredis is not installed
        conn._command_packer = PythonRespSerializer(conn._buffer_cutoff, conn.encoder.encode)
    return conn


def wire(conn: redis.Connection, commands: list[tuple[object, ...]]) -> bytes:
    return b"".join(bytes(chunk) for chunk in pack(conn, commands))


def test_a_command_ending_with_packed_arguments_sends_the_bytes_of_the_whole_command() -> None:
    args = ["3", "t1", "7", '{"text": "é"}', "w1", "0", "é74"]
    command = Tail().command(("FCALL", "f", 1, "{p}:"), args, 4)
    assert type(command[-1]) is Packed and command[-1].args == ["w1", "0", "é74"]
    whole = ("FCALL", "f", 1, "{p}:", *args)
    for conn in (connection(), connection(python_packer=True)):
        assert wire(conn, [command, ("PING",)]) == wire(conn, [whole, ("PING",)])
    assert wire(connection(), [command]) == hiredis.pack_command(whole)


def test_the_kept_arguments_follow_a_change() -> None:
    tail, head = Tail(), ("FCALL", "f", 1, "{p}:")
    first = tail.command(head, ["a", "w1", "75"], 1)
    assert tail.command(head, ["b", "w1", "75"], 1)[-1] is first[-1]  # the same arguments: kept
    changed = tail.command(head, ["b", "w1", "74"], 1)
    assert changed[-1] is not first[-1]
    assert wire(connection(), [changed]) == hiredis.pack_command((*head, "b", "w1", "74"))


def test_an_ack_claims_command_packs_as_its_whole_arguments() -> None:
    """The claim's arguments of an ack_claim (after its acks') and of a claim alone are the
    kept ones; the bytes sent are those of the call's every argument."""
    calls, keys = Calls(Config(pool="p")), Keys("p")
    scripts = Scripts(redis.Redis(host="127.0.0.1", port=1), keys)
    claim = calls.claim(ClaimRequest("w1", 75.0, 0.0, 1, [("m", 1.0)]))
    (joined, _), = carried(joined_acks([calls.ack("t1", 3, '{"ok": 1}'), calls.ack("t2", 4, "2"), claim]))
    assert joined.script == "ack_claim"
    for call in (joined, claim, calls.ack("t1", 3, "1")):
        assert wire(connection(), [scripts.command(call)]) == hiredis.pack_command(
            scripts.sender.command(call))


def test_an_ack_claim_whose_count_says_nowhere_is_sent_as_it_is() -> None:
    scripts = Scripts(redis.Redis(host="127.0.0.1", port=1), Keys("p"))
    for count in ("x", "-1", "99", "1.5", "²"):
        call = Call("ack_claim", [count, "t1", "3", "0", "1", "60", "w1"], lambda r: r)
        assert scripts.command(call) == scripts.sender.command(call)


def test_each_client_keeps_its_own_connection_whichever_was_last() -> None:
    """The last client's kept connection is found first: clients taking turns, or one made
    where a collected one was, still each get their own."""
    a, b = redis.Redis(host="127.0.0.1", port=1), redis.Redis(host="127.0.0.1", port=1)
    kept_a, kept_b = _kept_for(a), _kept_for(b)
    assert kept_a is not kept_b
    assert [_kept_for(c) for c in (a, a, b, a, b, b)] == [kept_a, kept_a, kept_b, kept_a, kept_b, kept_b]
    del a, b
    gc.collect()
    assert _kept_for(redis.Redis(host="127.0.0.1", port=1)) not in (kept_a, kept_b)
