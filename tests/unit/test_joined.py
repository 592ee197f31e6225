"""Consecutive acks joined into one script call, and its reply split back per ack."""

from __future__ import annotations

from gpuq.call import Call
from gpuq.joined import joined_acks, split_replies, wrote


def ack(task: str, now: str = "0", ttl: str = "1000") -> Call[None]:
    return Call("ack", [task, "7", now, '"r-' + task + '"', ttl], lambda r: None)


def fail(task: str) -> Call[None]:
    return Call("fail", [task, "7", "0", "boom", "1"], lambda r: None)


def test_consecutive_acks_at_one_now_and_ttl_become_one_call() -> None:
    calls = [ack("a"), ack("b"), fail("c"), ack("d"), ack("e", now="5"), ack("f", now="5", ttl="9")]
    joined = joined_acks(calls)
    assert [(c.script, n) for c, n in joined] == [("ack", 2), ("fail", 1), ("ack", 1), ("ack", 1),
                                                   ("ack", 1)]
    assert joined[0][0].args == ["a", "7", "0", '"r-a"', "1000", "b", "7", '"r-b"']
    assert calls[0].args == ["a", "7", "0", '"r-a"', "1000"]  # the caller's call is untouched


def test_replies_split_back_per_call_with_plain_commands_after() -> None:
    joined = joined_acks([ack("a"), ack("b"), ack("c"), fail("d")])
    replies = [[[0], [5, "queued"], [0]], [0, "failed"], "popped"]
    assert split_replies(replies, joined) == [[0], [5, "queued"], [0], [0, "failed"], "popped"]
    invalid = [1, 0, "now and ttl must be ms >= 0"]  # the call's own: each ack's answer
    assert split_replies([invalid, [0, "failed"]], joined) == [invalid] * 3 + [[0, "failed"]]


def test_a_joined_reply_wrote_when_any_ack_did() -> None:
    assert wrote([0]) and wrote([[5, "queued"], [0]])
    assert not wrote([[5, "queued"], [4]]) and not wrote([1, 0, "bad"]) and not wrote("x")
