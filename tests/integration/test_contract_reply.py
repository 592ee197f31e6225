"""Contract suite: the claim reply's wire form, a task's values alone in TASK_FIELDS' order.

Runs on fakeredis and on the real server (the ``backend`` fixture). The names come from
lib/take.lua's ``--@reply`` lines (gpuq.lua_source.reply_fields); these tests check that the
values the script sends stand where those names say, for a claim and for the claim part of
an ``ack_claim`` call.
"""

from __future__ import annotations

from typing import Any

from helpers import T0, claim, enqueue

from gpuq import Queue
from gpuq.claims import TASK_FIELDS, ClaimRequest


def stored(queue: Queue, task_id: str) -> dict[str, str]:
    return queue.redis.hgetall(queue.keys.task(task_id))


def values_only(reply: Any) -> dict[str, Any]:
    """A raw claim reply of one task, checked to carry no names: its values by field name."""
    assert reply[:2] == [0, "task"] and len(reply) == 2 + len(TASK_FIELDS)
    assert not set(TASK_FIELDS) & set(reply[2:])
    return dict(zip(TASK_FIELDS, reply[2:]))


def assert_as_stored(got: dict[str, Any], h: dict[str, str], worker: str, sla: str) -> None:
    assert h["state"] == "running" and h["worker"] == worker
    assert got["token"] == int(h["token"])  # an integer on the wire
    for name in ("id", "handler", "payload", "model", "vram_gb", "priority", "est_s", "attempt",
                 "deadline", "tenant", "enqueued_at", "queued_at", "started_at"):
        assert got[name] == h.get(name, ""), name  # no deadline: ""
    assert (got["checkpoint"], got["sla"], got["due_at"]) == ("", sla, "")


def test_a_claim_replies_the_tasks_values_in_task_fields_order(queue: Queue) -> None:
    tid = enqueue(queue, T0, handler="h.reply", payload={"p": 7}, model="m-reply", vram_gb=3.5,
                  priority=1, est_s=2.25, deadline_s=900, tenant="acme")
    req = ClaimRequest("w-reply", 40, 0, 1, (("m-reply", 1.0),))
    got = values_only(queue.scripts.run_raw(queue.calls.claim(req, now_ms=T0 + 10)))
    h = stored(queue, tid)
    assert_as_stored(got, h, "w-reply", "met")
    assert (got["priority"], got["attempt"], got["started_at"]) == ("1", "1", str(T0 + 10))
    assert queue.calls.claim(req).parse([0, "task", *got.values()]).task == {
        k: str(v) for k, v in got.items()}


def test_an_ack_claims_claim_part_replies_values_alone_too(queue: Queue) -> None:
    first = enqueue(queue, T0, handler="h.one", model="m-reply", vram_gb=2)
    second = enqueue(queue, T0 + 1, handler="h.two", payload=[1, 2], model="m-reply", vram_gb=2,
                     tenant="t2")
    c = claim(queue, "w-ack", 40, loaded=[("m-reply", 1.0)], now_ms=T0 + 5)
    assert c is not None and c["id"] == first
    req = ClaimRequest("w-ack", 40, 0, 1, (("m-reply", 1.0),), unlisted=True)
    ack_call = queue.calls.ack(first, int(c["token"]), '"ok"', now_ms=T0 + 6)
    acked, reply = queue.scripts.pipelined([ack_call, queue.calls.claim(req, now_ms=T0 + 6)])
    assert acked == [0] and queue.redis.hget(queue.keys.task(first), "state") == "succeeded"
    assert_as_stored(values_only(reply), stored(queue, second), "w-ack", "met")
