"""Calls sent in one round trip that go as one script call: a batch's acks, and acks with
the claim they ride with.

A batch handler (or an async worker's engine) ends several tasks at once; their acks ride
with the worker's next claim. Sent as they are, each pays a script call's fixed cost (its
arguments, the script's set-up, a clock read) for about nine commands of work; joined, the
batch pays it once. Each task is still acked on its own, fenced by its own token. The acks
and the claim after them then go as one call too (``ack_claim``, gpuq.lua_source.JOINED):
one call and one clock read a task fewer on a busy worker's path; the server runs the acks,
then the claim, as the two calls would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuq.call import Call
from gpuq.replies import Code


def joined_acks(calls: Sequence[Call[Any]]) -> list[tuple[Call[Any], int]]:
    """The calls, each run of consecutive acks at the same now and TTL made one ack call of
    several tasks (ack.lua's triples: one script call's overhead and clock read for a whole
    batch's results); with how many calls each stands for."""
    if len(calls) < 3 and (len(calls) < 2 or calls[0].script != "ack" or calls[1].script != "ack"):
        return [(call, 1) for call in calls]  # a runner's ack and claim: nothing to join
    out: list[tuple[Call[Any], int]] = []
    for call in calls:
        last, n = out[-1] if out else (None, 0)
        if (call.script == "ack" and last is not None and last.script == "ack"
                and last.args[2] == call.args[2] and last.args[4] == call.args[4]):
            if n == 1:  # the first join: a copy, so the caller's call keeps its own arguments
                last = last._replace(args=list(last.args))
            last.args.extend((call.args[0], call.args[1], call.args[3]))
            out[-1] = (last, n + 1)
        else:
            out.append((call, 1))
    return out


def carried(joined: list[tuple[Call[Any], int]]) -> list[tuple[Call[Any], int]]:
    """``joined_acks``' calls with an ack call (of one task or several) right before a claim
    made one ``ack_claim`` call: the ack's argument count, its arguments, the claim's."""
    if len(joined) == 2:  # a runner's ack (or a batch's) and claim: no loop
        (ack, k), (call, n) = joined
        if call.script != "claim" or ack.script != "ack":
            return joined
        return [(_ack_claim(ack, call), k + 1)]
    out: list[tuple[Call[Any], int]] = []
    for call, n in joined:
        if call.script == "claim" and out and out[-1][0].script == "ack":
            ack, k = out.pop()
            out.append((_ack_claim(ack, call), k + 1))
        else:
            out.append((call, n))
    return out


def _ack_claim(ack: Call[Any], claim: Call[Any]) -> Call[Any]:
    """One ``ack_claim`` call of an ack call and the claim after it: the ack's argument
    count, its arguments, the claim's (gpuq/lua_source.py's split)."""
    return Call("ack_claim", [str(len(ack.args)), *ack.args, *claim.args], claim.parse, ack.replicas)


def claim_start(call: Call[Any]) -> int:
    """Where a claim's arguments start among a call's (a claim's, or an ``ack_claim``'s after
    its acks'); -1: none (another script, or a malformed count, sent as it is)."""
    if call.script == "claim":
        return 0 if call.args else -1
    if call.script != "ack_claim" or not call.args[0].isdecimal():
        return -1
    start = 1 + int(call.args[0])
    return start if start < len(call.args) else -1


def _acks(reply: Any, n: int) -> list[Any]:
    """An ack call's reply as one per task it acked."""
    if n == 1:
        return [reply]
    if isinstance(reply, list) and len(reply) == n and all(isinstance(r, list) for r in reply):
        return list(reply)
    # {0}: every task was acked (ack.lua's one reply for all); or the call's own INVALID (a
    # malformed now or TTL): each ack's answer
    return [reply] * n


def split_replies(replies: list[Any], joined: list[tuple[Call[Any], int]]) -> list[Any]:
    """The replies of joined calls as one per original call (the plain commands' after)."""
    if len(joined) == 1 and len(replies) == 1:  # a runner's ack_claim alone (no WAIT, no extra)
        (call, n), reply = joined[0], replies[0]
        if (n == 2 and call.script == "ack_claim" and type(reply) is list and len(reply) == 2
                and type(reply[0]) is list and type(reply[1]) is list):
            return reply  # one ack's reply, then the claim's
    out: list[Any] = []
    for (call, n), reply in zip(joined, replies):
        if call.script != "ack_claim":
            out += _acks(reply, n)
        elif isinstance(reply, list) and len(reply) == 2 and isinstance(reply[0], list) \
                and isinstance(reply[1], list):
            out += _acks(reply[0], n - 1) + [reply[1]]
        else:  # an error of the whole call, or its own INVALID: every part's answer
            out += [reply] * n
    return out + replies[len(joined):]


def wrote(reply: Any) -> bool:
    """Whether a script's reply says it wrote (OK; for several acks, any of them)."""
    if not (isinstance(reply, list) and reply):
        return False
    if isinstance(reply[0], list):
        return any(wrote(r) for r in reply)
    return int(reply[0]) == Code.OK
