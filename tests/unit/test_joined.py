"""Consecutive acks joined into one script call, acks with the claim after them made one
call, and the replies split back per call."""

from __future__ import annotations

from gpuq.call import Call
from gpuq.joined import carried, joined_acks, split_replies, wrote


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


def claim(worker: str = "w1") -> Call[str]:
    return Call("claim", [worker, "0", "40"], lambda r: "parsed")


def test_acks_right_before_a_claim_go_with_it_as_one_call() -> None:
    calls = [ack("a"), ack("b"), claim(), fail("c"), claim("w2"), ack("d"), claim("w3"), claim("w4")]
    joined = carried(joined_acks(calls))
    assert [(c.script, n) for c, n in joined] == [("ack_claim", 3), ("fail", 1), ("claim", 1),
                                                   ("ack_claim", 2), ("claim", 1)]
    first = joined[0][0]
    assert first.args == ["8", "a", "7", "0", '"r-a"', "1000", "b", "7", '"r-b"', "w1", "0", "40"]
    assert first.parse([]) == "parsed"  # the claim's parser
    assert joined[3][0].args == ["5", "d", "7", "0", '"r-d"', "1000", "w3", "0", "40"]


def test_a_carried_call_s_reply_splits_into_its_acks_and_its_claim() -> None:
    joined = carried(joined_acks([ack("a"), ack("b"), claim(), ack("c"), claim()]))
    got = claim_reply = [0, "none", 0]
    replies = [[[[0], [5, "queued"]], claim_reply], [[0], got], "popped"]
    assert split_replies(replies, joined) == [[0], [5, "queued"], claim_reply, [0], got, "popped"]
    invalid = [1, 0, "the first argument must count the arguments of the first part"]
    error = ValueError("boom")
    assert split_replies([invalid, error], joined) == [invalid] * 3 + [error] * 2


def test_a_runner_s_one_ack_and_claim_go_as_one_call_and_split_back() -> None:
    calls = [ack("a"), claim()]
    joined = carried(joined_acks(calls))
    assert [(c.script, n) for c, n in joined] == [("ack_claim", 2)]
    assert joined[0][0].args == ["5", "a", "7", "0", '"r-a"', "1000", "w1", "0", "40"]
    assert calls[1].args == ["w1", "0", "40"]  # the kept claim call is untouched
    got = [0, "task", "t1"]
    assert split_replies([[[0], got]], joined) == [[0], got]
    invalid = [1, 0, "the first argument must count the arguments of the first part"]
    error = ValueError("boom")
    for whole in (invalid, error, [[0], "not a list"], [[0]]):  # the whole call's answer
        assert split_replies([whole], joined) == [whole, whole]


def test_two_calls_not_an_ack_then_a_claim_go_as_they_are() -> None:
    for calls in ([claim(), ack("a")], [fail("a"), claim()], [ack("a"), fail("b")], [claim()], []):
        joined = carried(joined_acks(calls))
        assert [c for c, _ in joined] == calls
        replies = [[0, "x"]] * len(calls) + ["popped"]
        assert split_replies(replies, joined) == replies
    two = carried(joined_acks([ack("a"), ack("b")]))
    assert [(c.script, n) for c, n in two] == [("ack", 2)]
