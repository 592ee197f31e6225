"""Contract suite, part 4: the SLA is decided when a task's handler starts, model loaded.

A task claimed (or handed over) by a worker that holds its model starts its handler at once:
the claim decides. One started cold is decided by began.lua, which the worker calls after the
load. Each task counts once, at its first handler start. Each test runs on fakeredis and on
the real server (the ``backend`` fixture); real worker processes: test_metrics.py and
test_worker.py.
"""

from __future__ import annotations

import json

import pytest
from helpers import T0, ack, claim, enqueue
from test_contract_handover import pop_wake, register

from gpuq import Queue
from gpuq.errors import InvalidTask, StaleLease, TaskNotFound
from gpuq.scripts import Call, Claim, ClaimRequest
from gpuq.task import State

SLA_MS = 200  # P0's default


def stats(q: Queue) -> dict[str, str]:
    return dict(q.redis.hgetall(q.keys.stats))


def misses(q: Queue) -> list[dict[str, object]]:
    return [json.loads(m) for m in q.redis.lrange(q.keys.sla_misses, 0, -1)]


def began(q: Queue, task_id: str, token: str | int, now_ms: int) -> tuple[str, int]:
    return q.scripts.run(q.calls.began(task_id, int(token), now_ms=now_ms))


def test_a_warm_claim_decides_at_once(queue: Queue) -> None:
    tid = enqueue(queue, T0, priority="P0", model="m", vram_gb=4)
    c = claim(queue, "w1", 20, loaded=[("m", 4)], now_ms=T0 + 50)
    assert c is not None and c["sla"] == "met"
    assert stats(queue)["sla_met:P0"] == "1"
    assert queue.redis.hget(queue.keys.task(tid), "began_at") == str(T0 + 50)
    late = enqueue(queue, T0, priority="P0", model="m", vram_gb=4)
    c = claim(queue, "w1", 20, loaded=[("m", 4)], now_ms=T0 + SLA_MS + 1)
    assert c is not None and c["id"] == late and c["sla"] == "missed"
    assert [m["kind"] for m in misses(queue)] == ["late"]


def test_a_task_of_a_model_still_loading_on_the_worker_starts_cold(queue: Queue) -> None:
    """Regression: a worker preloading a model (a warm hint), or loading it for another slot's
    task, listed it as loaded: the claim of a task of it decided the SLA "met" at the claim,
    and the handler started when the load ended, 12 s later. Listed as loading ("~"), the
    task starts cold: pending, `loading` until began.lua decides at the handler's start; a
    batch's tasks are not taken beside it (claim_batch.lua asks after the load)."""
    tid = enqueue(queue, T0, priority="P0", model="m", vram_gb=4)
    req = ClaimRequest("w1", 20, 0, 2, (("m", 4),), in_use=frozenset({"m"}), loading=frozenset({"m"}))
    assert queue.calls.claim(req).args[-1] == "~-4"
    c = queue.scripts.run(queue.calls.claim(req, now_ms=T0 + 10)).task
    assert c is not None and c["id"] == tid and c["sla"] == "pending"
    assert "sla_met:P0" not in stats(queue)
    assert queue.redis.hmget(queue.keys.task(tid), "loading", "began_at") == ["1", None]
    assert began(queue, tid, c["token"], T0 + 10 + 12_000) == ("missed", T0 + 12_010)
    assert [m["kind"] for m in misses(queue)] == ["cold"]
    # once loaded, the same model's next task is warm again
    warm = enqueue(queue, T0 + 20_000, priority="P0", model="m", vram_gb=4)
    req = ClaimRequest("w1", 20, 0, 2, (("m", 4),), in_use=frozenset({"m"}))
    c = queue.scripts.run(queue.calls.claim(req, now_ms=T0 + 20_010)).task
    assert c is not None and c["id"] == warm and c["sla"] == "met"


@pytest.mark.parametrize("value", ["~", "~x", "~1e999", "~~4"])
def test_a_malformed_loading_pair_is_refused(queue: Queue, value: str) -> None:
    enqueue(queue, T0, model="m", vram_gb=4)
    args = ["w1", str(T0), "20", "0", "1", queue.calls.claim(ClaimRequest("w1", 20, 0, 1)).args[5],
            "0123", "1", "0", "0", "m", value]
    with pytest.raises(InvalidTask, match="malformed model pair"):
        queue.scripts.run(Call("claim", args, Claim.parse))


def test_a_cold_start_in_time_that_loads_past_the_sla_is_missed_when_its_handler_starts(
        queue: Queue) -> None:
    tid = enqueue(queue, T0, priority="P0", model="m", vram_gb=4)
    c = claim(queue, "w1", 20, now_ms=T0 + 10)  # claimed in time, the model not held
    assert c is not None and c["sla"] == "pending"
    assert "sla_met:P0" not in stats(queue) and "sla_missed:P0" not in stats(queue)
    assert began(queue, tid, c["token"], T0 + 10 + 1500) == ("missed", T0 + 1510)
    s = stats(queue)
    assert s["sla_missed:P0"] == "1" and "sla_met:P0" not in s
    (miss,) = misses(queue)
    assert (miss["id"], miss["kind"], miss["wait_s"]) == (tid, "cold", 1.51)
    assert queue.redis.hget(queue.keys.task(tid), "began_at") == str(T0 + 1510)
    # a second report of the same start counts nothing
    assert began(queue, tid, c["token"], T0 + 2000) == ("", T0 + 2000)
    assert stats(queue)["sla_missed:P0"] == "1" and len(misses(queue)) == 1


def test_a_cold_start_that_loads_within_the_sla_is_met(queue: Queue) -> None:
    tid = enqueue(queue, T0, priority="P0", model="m", vram_gb=4)
    c = claim(queue, "w1", 20, now_ms=T0 + 10)
    assert c is not None
    assert began(queue, tid, c["token"], T0 + SLA_MS) == ("met", T0 + SLA_MS)
    assert stats(queue)["sla_met:P0"] == "1" and misses(queue) == []


def test_a_cold_start_claimed_late_is_noted_late(queue: Queue) -> None:
    tid = enqueue(queue, T0, priority="P0", model="m", vram_gb=4)
    c = claim(queue, "w1", 20, now_ms=T0 + SLA_MS + 5)
    assert c is not None
    assert began(queue, tid, c["token"], T0 + 900)[0] == "missed"
    assert [m["kind"] for m in misses(queue)] == ["late"]


def test_a_task_yielded_during_its_load_counts_once_at_its_next_start(queue: Queue) -> None:
    """The yield gives the attempt back (attempt 1 again): the first handler start decides,
    and the start after it counts nothing."""
    tid = enqueue(queue, T0, priority="P0", model="m", vram_gb=4)
    c = claim(queue, "w1", 20, now_ms=T0 + 10)
    assert c is not None and c["sla"] == "pending"
    queue.scripts.run(queue.calls.requeue(tid, int(c["token"]), "yielded", preempted="yielded",
                                          now_ms=T0 + 100))
    with pytest.raises(StaleLease):  # a late report of the yielded start is fenced off
        began(queue, tid, c["token"], T0 + 150)
    assert not any(k.startswith("sla_") for k in stats(queue))
    again = claim(queue, "w1", 20, loaded=[("m", 4)], now_ms=T0 + 400)
    assert again is not None and again["attempt"] == "1" and again["sla"] == "missed"
    ack(queue, tid, again["token"], now_ms=T0 + 500)
    s = stats(queue)
    assert s["sla_missed:P0"] == "1" and "sla_met:P0" not in s


def test_a_task_started_again_after_its_handler_ran_is_not_counted_again(queue: Queue) -> None:
    tid = enqueue(queue, T0, priority="P0", model="m", vram_gb=4)
    c = claim(queue, "w1", 20, loaded=[("m", 4)], now_ms=T0 + 10)
    assert c is not None and c["sla"] == "met"
    queue.scripts.run(queue.calls.requeue(tid, int(c["token"]), "yielded", preempted="yielded",
                                          now_ms=T0 + 50))
    # decided by the first start: a warm start again says nothing; a cold one is "pending"
    # (its worker reports the load's end), and its began counts nothing
    for worker, loaded, sla in (("w2", [], "pending"), ("w1", [("m", 4.0)], "")):
        again = claim(queue, worker, 20, loaded=loaded, now_ms=T0 + 900)
        assert again is not None and again["sla"] == sla
        if sla:
            assert began(queue, tid, again["token"], T0 + 920)[0] == ""
        queue.scripts.run(queue.calls.requeue(tid, int(again["token"]), "shutdown",
                                              now_ms=T0 + 950))
    assert stats(queue)["sla_met:P0"] == "1" and "sla_missed:P0" not in stats(queue)


def test_a_hand_over_is_decided_when_its_handler_starts_warm_or_cold(queue: Queue) -> None:
    register(queue, "w1")
    cold = enqueue(queue, T0 + 10, priority="P0", model="m", vram_gb=4)
    fields = pop_wake(queue, "w1")
    assert fields["id"] == cold and fields["sla"] == "pending"
    assert began(queue, cold, fields["token"], T0 + 10 + 400)[0] == "missed"
    ack(queue, cold, fields["token"], now_ms=T0 + 500)
    queue.redis.sadd(queue.keys.holders("m"), "w1")  # the worker now holds m
    assert claim(queue, "w1", 19, now_ms=T0 + 600) is None  # idle again
    warm = enqueue(queue, T0 + 700, priority="P0", model="m", vram_gb=4)
    fields = pop_wake(queue, "w1")
    # it may yet be taken back: only its handler's start decides, warm too
    assert fields["id"] == warm and fields["sla"] == "pending"
    assert queue.redis.hget(queue.keys.task(warm), "began_at") is None
    assert began(queue, warm, fields["token"], T0 + 702)[0] == "met"
    assert queue.redis.hget(queue.keys.task(warm), "began_at") == str(T0 + 702)
    s = stats(queue)
    assert (s["sla_met:P0"], s["sla_missed:P0"]) == ("1", "1")


def test_began_is_fenced_and_checks_its_arguments(queue: Queue) -> None:
    tid = enqueue(queue, T0, priority="P1", model="m", vram_gb=4)
    c = claim(queue, "w1", 20, now_ms=T0 + 10)
    assert c is not None
    with pytest.raises(StaleLease):
        began(queue, tid, int(c["token"]) + 1, T0 + 20)
    with pytest.raises(TaskNotFound):
        began(queue, "nope", 1, T0 + 20)
    with pytest.raises(InvalidTask):
        queue.scripts.run(queue.calls.began(tid, int(c["token"]), now_ms=-5))
    ack(queue, tid, c["token"], now_ms=T0 + 30)
    with pytest.raises(StaleLease):  # ended: its handler cannot start any more
        began(queue, tid, c["token"], T0 + 40)
    assert queue.record(tid).state is State.SUCCEEDED
    assert not any(k.startswith("sla_") for k in stats(queue))


def test_a_warm_claim_takes_a_task_that_can_still_meet_its_sla_before_a_late_one(
        queue: Queue) -> None:
    late = enqueue(queue, T0, priority="P0", model="m", vram_gb=4)
    fresh = enqueue(queue, T0 + 1000, priority="P0", model="m", vram_gb=4)
    now = T0 + 1000 + SLA_MS // 2  # late's start-by time has passed, fresh's has not
    c = claim(queue, "w1", 20, loaded=[("m", 4)], now_ms=now)
    assert c is not None and (c["id"], c["sla"]) == (fresh, "met")
    c = claim(queue, "w2", 20, loaded=[("m", 4)], now_ms=now)
    assert c is not None and (c["id"], c["sla"]) == (late, "missed")
    # the late task still goes before lower levels' work
    late = enqueue(queue, T0, priority="P0", model="m", vram_gb=4)
    enqueue(queue, now, priority="P1", model="m", vram_gb=4)
    c = claim(queue, "w3", 20, loaded=[("m", 4)], now_ms=now)
    assert c is not None and c["id"] == late


def test_a_cold_claim_takes_its_queue_oldest_first(queue: Queue) -> None:
    # a cold start misses a 200 ms SLA whichever task it takes: the oldest goes first
    late = enqueue(queue, T0, priority="P0", model="m", vram_gb=4)
    enqueue(queue, T0 + 1000, priority="P0", model="m", vram_gb=4)
    c = claim(queue, "w1", 20, now_ms=T0 + 1000 + SLA_MS // 2)
    assert c is not None and c["id"] == late


def test_a_warm_hand_over_taken_back_is_decided_where_its_handler_starts(queue: Queue) -> None:
    """Handed to an idle holder that never picked it up: taken back at its pickup deadline
    and started cold elsewhere, its handler starting past the SLA; that start decides."""
    register(queue, "w1")
    register(queue, "w2")
    queue.redis.sadd(queue.keys.holders("m"), "w1")
    tid = enqueue(queue, T0 + 10, priority="P0", model="m", vram_gb=4)
    assert queue.record(tid).worker == "w1"
    assert "sla_met:P0" not in stats(queue)  # its handler has not started
    c = claim(queue, "w2", 19, now_ms=T0 + 10 + 100)  # its pickup deadline: taken back
    assert c is not None and c["id"] == tid and c["sla"] == "pending"
    assert began(queue, tid, c["token"], T0 + 10 + 5_000)[0] == "missed"
    s = stats(queue)
    assert (s.get("sla_met:P0"), s["sla_missed:P0"]) == (None, "1")
    assert [m["kind"] for m in misses(queue)] == ["cold"]


def test_a_warm_hand_over_taken_up_late_is_noted_late_not_cold(queue: Queue) -> None:
    """Handed at enqueue to an idle holder of its model, in time, and taken up past its
    start-by time: no load came between, so the miss is the taking up's (late)."""
    register(queue, "w1")
    queue.redis.sadd(queue.keys.holders("m"), "w1")
    tid = enqueue(queue, T0 + 10, priority="P0", model="m", vram_gb=4)
    fields = pop_wake(queue, "w1")
    assert fields["id"] == tid
    late = queue.calls.began(tid, int(fields["token"]), now_ms=T0 + 10 + SLA_MS + 50, warm=True)
    assert queue.scripts.run(late)[0] == "missed"
    (miss,) = misses(queue)
    assert (miss["id"], miss["kind"], miss["wait_s"]) == (tid, "late", 0.25)
