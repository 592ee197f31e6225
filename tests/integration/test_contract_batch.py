"""Contract suite: claim_batch.lua adds queued tasks of one handler and model to a batch.

Each test runs on fakeredis and on the real server (the ``queue`` fixture). A batch's first
task is claimed as usual (claim.lua); claim_batch takes more from that task's own queue, each
started as claim starts one.
"""

from __future__ import annotations

import pytest
import redis
from helpers import T0, ack, claim, claim_batch, claim_reply, enqueue, heartbeat

from gpuq import Queue
from gpuq.claims import Claim
from gpuq.errors import StaleLease
from gpuq.scripts import Call, ClaimRequest
from gpuq.task import State
from gpuq.tenants import Tenant, set_tenant
from gpuq.work_index import member, score

HELD = [("A", 2.0)]  # the worker holds model A (2 GB): a warm start


def batch_ids(q: Queue, n: int, priority: str = "P1", handler: str = "emb", now: int = T0,
              **options: object) -> list[str]:
    return [enqueue(q, now + i, handler=handler, priority=priority, **options) for i in range(n)]


def first(q: Queue, now: int = T0 + 100, free: float = 40, worker: str = "w1") -> dict[str, str]:
    c = claim(q, worker, free, loaded=HELD, now_ms=now)
    assert c is not None
    return c


def test_a_batch_takes_queued_tasks_of_the_same_handler_model_and_level(queue: Queue) -> None:
    p1 = batch_ids(queue, 3, "P1")
    p0 = batch_ids(queue, 3, "P0")
    other_handler = enqueue(queue, T0, handler="gen", priority="P0")
    other_model = enqueue(queue, T0, handler="emb", priority="P0", model="B")
    c = first(queue)
    assert c["id"] == p0[0]
    got = claim_batch(queue, "w1", c, 40, 2, now_ms=T0 + 100)
    assert [t["id"] for t in got.tasks] == p0[1:]  # P0 only: no P1 mixed in behind them
    for tid in (*p1, other_handler, other_model):
        assert queue.record(tid).state is State.QUEUED
    for t in got.tasks:
        r = queue.record(t["id"])
        assert (r.state, r.worker, r.attempt, t["attempt"]) == (State.RUNNING, "w1", 1, "1")
        assert queue.redis.zscore(queue.keys.running, t["id"]) is not None
    assert queue.redis.smembers(queue.keys.worker_tasks("w1")) == {c["id"], *p0[1:]}
    # the earliest start-by score of the batch: the first P0 task's (enqueued at T0, SLA 200 ms)
    assert got.left_ms == T0 + 200 - (T0 + 100)


def test_at_most_count_tasks_oldest_first(queue: Queue) -> None:
    ids = batch_ids(queue, 6)
    c = first(queue)
    got = claim_batch(queue, "w1", c, 40, 2, count=3, now_ms=T0 + 100)
    assert [t["id"] for t in got.tasks] == ids[1:4]
    assert claim_batch(queue, "w1", c, 40, 2, count=0, now_ms=T0 + 100).tasks == []


def test_the_scan_is_bounded(make_queue: object) -> None:
    q = make_queue(scan_per_queue=2)  # type: ignore[operator]
    emb = enqueue(q, T0, handler="emb", priority="P1")
    blockers = batch_ids(q, 4, handler="gen", now=T0 + 1)  # 4 x count(1) ids examined
    late = enqueue(q, T0 + 10, handler="emb", priority="P1")
    c = first(q)
    assert c["id"] == emb
    assert claim_batch(q, "w1", c, 40, 2, count=1, now_ms=T0 + 100).tasks == []
    assert q.record(late).state is State.QUEUED
    got = claim_batch(q, "w1", c, 40, 2, count=2, now_ms=T0 + 100)  # 8 examined
    assert [t["id"] for t in got.tasks] == [late]
    assert all(q.record(b).state is State.QUEUED for b in blockers)


def test_each_task_s_working_memory_fits_what_is_left(queue: Queue) -> None:
    small = batch_ids(queue, 2, vram_gb=4)  # 2 GB of working memory each beside the model
    big = enqueue(queue, T0 + 5, handler="emb", priority="P1", vram_gb=9)  # 7 GB
    tail = enqueue(queue, T0 + 6, handler="emb", priority="P1", vram_gb=3)  # 1 GB
    c = first(queue)
    assert c["id"] == small[0]
    got = claim_batch(queue, "w1", c, 3.5, 2, now_ms=T0 + 100)  # 3.5 GB left after the first
    assert [t["id"] for t in got.tasks] == [small[1], tail]  # 2 + 1 <= 3.5; the 7 GB one not
    assert queue.record(big).state is State.QUEUED


def test_stale_and_corrupt_ids_are_handled_as_claim_handles_them(queue: Queue) -> None:
    ids = batch_ids(queue, 4)
    c = first(queue)
    queue.redis.delete(queue.keys.task(ids[1]))  # a stale id: its hash is gone
    queue.redis.hset(queue.keys.task(ids[2]), "attempt", "x")  # corrupt
    got = claim_batch(queue, "w1", c, 40, 2, now_ms=T0 + 100)
    assert [t["id"] for t in got.tasks] == [ids[3]]
    assert queue.redis.zrange(queue.keys.queue(1, "A"), 0, -1) == []
    state, error = queue.redis.hmget(queue.keys.task(ids[2]), "state", "error")
    assert (state, error) == ("failed", "corrupt task: field attempt is missing or malformed")


def test_every_task_has_its_own_fencing_token(queue: Queue) -> None:
    batch_ids(queue, 4)
    c = first(queue)
    got = claim_batch(queue, "w1", c, 40, 2, now_ms=T0 + 100)
    tokens = [int(c["token"])] + [int(t["token"]) for t in got.tasks]
    assert len(set(tokens)) == 4
    for t in got.tasks:
        assert queue.redis.hget(queue.keys.task(t["id"]), "token") == t["token"]
    one, two = got.tasks[0], got.tasks[1]
    with pytest.raises(StaleLease):
        ack(queue, one["id"], two["token"], now_ms=T0 + 200)
    ack(queue, one["id"], one["token"], {"v": 1}, now_ms=T0 + 200)
    assert queue.record(one["id"]).state is State.SUCCEEDED
    assert queue.record(two["id"]).state is State.RUNNING


def test_the_sla_is_decided_per_task(queue: Queue) -> None:
    late = enqueue(queue, T0, handler="emb", priority="P1")  # start by T0 + 1000
    fresh = enqueue(queue, T0 + 900, handler="emb", priority="P1")  # by T0 + 1900
    newer = enqueue(queue, T0 + 950, handler="emb", priority="P1")
    c = first(queue, now=T0 + 1500)  # a warm claim takes those still on time first
    assert c["id"] == fresh and c["sla"] == "met"
    got = claim_batch(queue, "w1", c, 40, 2, now_ms=T0 + 1500)
    assert {t["id"]: t["sla"] for t in got.tasks} == {late: "missed", newer: "met"}
    assert got.left_ms == -500  # the late task's start-by time has passed
    stats = queue.redis.hgetall(queue.keys.stats)
    assert (stats["sla_met:P1"], stats["sla_missed:P1"]) == ("2", "1")


def test_a_cold_batch_leaves_each_sla_to_began(queue: Queue) -> None:
    ids = batch_ids(queue, 3)
    c = claim(queue, "w1", 40, now_ms=T0 + 100)  # holds nothing: a cold start
    assert c is not None and c["sla"] == "pending"
    got = claim_batch(queue, "w1", c, 36, 1, warm=False, now_ms=T0 + 100)
    assert [t["sla"] for t in got.tasks] == ["pending", "pending"]
    assert all(queue.redis.hget(queue.keys.task(t), "began_at") is None for t in ids)
    decided = queue.scripts.run(queue.calls.began(ids[1], int(got.tasks[0]["token"]), now_ms=T0 + 300))
    assert decided == ("met", T0 + 300)


def test_each_dispatch_counts_for_fairness(make_queue: object) -> None:
    q = make_queue(fair_every=5)  # type: ignore[operator]
    batch_ids(q, 4, "P0")
    enqueue(q, T0, handler="other", priority="P3", model="B")
    c = first(q)
    claim_batch(q, "w1", c, 40, 2, now_ms=T0 + 100)
    assert q.redis.hget(q.keys.fairness, "3") == "4"  # one claim and three batched dispatches
    more = batch_ids(q, 4, "P0", now=T0 + 200)
    c = first(q, now=T0 + 300)
    assert c["id"] == more[0]
    claim_batch(q, "w1", c, 40, 2, now_ms=T0 + 300)
    assert q.redis.hget(q.keys.fairness, "3") == "5"  # capped at fair_every: P3 goes next
    nxt = claim(q, "w1", 40, loaded=HELD, now_ms=T0 + 400)
    assert nxt is not None and nxt["priority"] == "3"


def test_a_batch_of_another_worker_s_task_takes_nothing(queue: Queue) -> None:
    ids = batch_ids(queue, 3)
    c = first(queue)
    with pytest.raises(StaleLease):
        claim_batch(queue, "w2", c, 40, 2, now_ms=T0 + 100)
    with pytest.raises(StaleLease):
        claim_batch(queue, "w1", {**c, "token": "999"}, 40, 2, now_ms=T0 + 100)
    assert [queue.record(t).state for t in ids[1:]] == [State.QUEUED, State.QUEUED]


def test_the_idle_score_drops_by_the_memory_the_batch_uses(queue: Queue) -> None:
    batch_ids(queue, 3, vram_gb=5)  # 3 GB each beside the 2 GB model
    c = claim(queue, "w1", 40, slots=2, loaded=HELD, now_ms=T0 + 100)
    assert c is not None
    assert queue.redis.zscore(queue.keys.idle, "w1") == 37
    claim_batch(queue, "w1", c, 37, 2, now_ms=T0 + 100)
    assert queue.redis.zscore(queue.keys.idle, "w1") == 31


def test_a_tenant_at_its_cap_is_passed_over(queue: Queue) -> None:
    set_tenant(queue, Tenant("a", max_gpus=2))
    a = batch_ids(queue, 3, tenant="a")
    b = enqueue(queue, T0 + 5, handler="emb", priority="P1", tenant="b")
    c = first(queue)
    assert c["id"] == a[0]
    got = claim_batch(queue, "w1", c, 40, 2, now_ms=T0 + 100)
    assert {t["id"] for t in got.tasks} == {a[1], b}  # a[2] would be a's third GPU task
    assert queue.redis.hget(queue.keys.tenant_use, "gpus:a") == "2"
    assert queue.record(a[2]).state is State.QUEUED
    assert queue.redis.hget(queue.keys.tenant_queued, "1:a") == "1"  # a[2] still counted


def test_malformed_arguments_are_invalid_and_write_nothing(queue: Queue) -> None:
    batch_ids(queue, 2)
    c = first(queue)
    call = queue.calls.claim_batch("w1", c, 40, 2, True, 2, now_ms=T0 + 100)
    for i, bad in ((2, "nan"), (7, "-1"), (8, "2"), (9, "x")):
        args = list(call.args)
        args[i] = bad
        reply = queue.scripts.run_raw(Call(call.script, args, call.parse))
        assert reply[0] == 1, (i, bad, reply)
    heartbeat(queue, "w1", [(c["id"], c["token"])], now_ms=T0 + 100)
    assert queue.redis.zcard(queue.keys.queue(1, "A")) == 1



def script_calls(q: Queue) -> int | None:
    """Script calls the server has run (None where it keeps no command stats)."""
    try:
        stats = q.redis.info("commandstats")
        return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha"))
    except redis.ResponseError:
        return None


def test_a_batch_s_acks_go_as_one_call_each_task_fenced_on_its_own(queue: Queue) -> None:
    batch_ids(queue, 4)
    c = first(queue)
    got = claim_batch(queue, "w1", c, 40, 2, now_ms=T0 + 100)
    one, two, three = got.tasks
    acks = [queue.calls.ack(c["id"], int(c["token"]), '{"v": 0}', now_ms=T0 + 200),
            queue.calls.ack(one["id"], int(two["token"]), '{"v": 1}', now_ms=T0 + 200),  # stale
            queue.calls.ack(two["id"], int(two["token"]), '{"v": nan}', now_ms=T0 + 200),  # not JSON
            queue.calls.ack(three["id"], int(three["token"]), '{"v": 3}', now_ms=T0 + 200)]
    before = script_calls(queue)
    replies = queue.scripts.pipelined(acks)
    if before is not None:  # the real server counts them
        assert script_calls(queue) == before + 1
    assert [r[0] for r in replies] == [0, 5, 1, 0]
    assert replies[2][2] == "result is not valid JSON"
    for call, reply in zip(acks, replies):  # each parses as its own ack would
        if reply[0] == 0:
            call.parse(reply)
    with pytest.raises(StaleLease):
        acks[1].parse(replies[1])
    assert [queue.record(t).state for t in (c["id"], one["id"], two["id"], three["id"])] == [
        State.SUCCEEDED, State.RUNNING, State.RUNNING, State.SUCCEEDED]
    assert queue.record(three["id"]).result == {"v": 3}
    assert queue.redis.smembers(queue.keys.worker_tasks("w1")) == {one["id"], two["id"]}
    assert [len(a.args) for a in acks] == [5, 5, 5, 5]  # the callers' calls are unchanged


def test_a_batch_whose_acks_all_succeed_gets_one_reply_for_all(queue: Queue) -> None:
    batch_ids(queue, 3)
    c = first(queue)
    got = claim_batch(queue, "w1", c, 40, 2, now_ms=T0 + 100)
    tasks = [c, *got.tasks]
    acks = [queue.calls.ack(t["id"], int(t["token"]), f'{{"v": {i}}}', now_ms=T0 + 200)
            for i, t in enumerate(tasks)]
    joined = Call("ack", [*acks[0].args, *(a for t in acks[1:] for a in (t.args[0], t.args[1], t.args[3]))],
                  acks[0].parse)
    assert queue.scripts.run_raw(joined) == [0]  # one element, not a list a task
    assert [queue.record(t["id"]).result for t in tasks] == [{"v": 0}, {"v": 1}, {"v": 2}]
    # the client reads it as each task's own reply
    batch_ids(queue, 3, now=T0 + 1000)
    c = first(queue, now=T0 + 1100)
    got = claim_batch(queue, "w1", c, 40, 2, now_ms=T0 + 1100)
    acks = [queue.calls.ack(t["id"], int(t["token"]), "1", now_ms=T0 + 1200) for t in [c, *got.tasks]]
    assert queue.scripts.pipelined(acks) == [[0], [0], [0]]


def test_acks_at_another_now_or_ttl_go_as_calls_of_their_own(queue: Queue) -> None:
    batch_ids(queue, 2)
    c = first(queue)
    got = claim_batch(queue, "w1", c, 40, 2, now_ms=T0 + 100)
    a = queue.calls.ack(c["id"], int(c["token"]), "1", now_ms=T0 + 200)
    b = queue.calls.ack(got.tasks[0]["id"], int(got.tasks[0]["token"]), "2", now_ms=T0 + 300)
    assert [r[0] for r in queue.scripts.pipelined([a, b])] == [0, 0]
    assert queue.record(got.tasks[0]["id"]).finished_at is not None


def test_acks_past_lua_s_stack_limit_ride_with_a_claim(queue: Queue) -> None:
    # 3,000 acks are 9,000 arguments of one ack_claim call: more than unpack may put on Lua's
    # stack (8,000), so the call splits them without it
    task = enqueue(queue, T0)
    acks = [queue.calls.ack(f"gone-{i}", 1, "1", now_ms=T0 + 100) for i in range(3000)]
    claim_call = queue.calls.claim(ClaimRequest("w1", 40, 0, 1, HELD), now_ms=T0 + 100)
    replies = queue.scripts.pipelined([*acks, claim_call])
    assert [r[0] for r in replies[:-1]] == [4] * 3000
    assert claim_call.parse(replies[-1]).task["id"] == task  # type: ignore[index]


def test_several_acks_with_a_short_triple_are_invalid_and_write_nothing(queue: Queue) -> None:
    batch_ids(queue, 2)
    c = first(queue)
    call = queue.calls.ack(c["id"], int(c["token"]), "1", now_ms=T0 + 200)
    reply = queue.scripts.run_raw(Call("ack", [*call.args, "x", "1"], call.parse))
    assert reply[0] == 1
    assert queue.record(c["id"]).state is State.RUNNING


# A claim that takes a batch handler's task on a held model takes the batch beside it.

def batch_claim(q: Queue, now: int = T0 + 100, free: float = 40, more: int = 31, **kw: object) -> Claim:
    return claim_reply(q, "w1", free, loaded=HELD, now_ms=now, batches=[("emb", more)], **kw)  # type: ignore[arg-type]


def test_a_claim_takes_the_batch_of_its_task_in_the_same_call(queue: Queue) -> None:
    p1 = batch_ids(queue, 2, "P1")
    p0 = batch_ids(queue, 4, "P0")
    other_handler = enqueue(queue, T0, handler="gen", priority="P0")
    got = batch_claim(queue, more=2)
    assert got.task is not None and got.task["id"] == p0[0]
    assert got.batch is not None and [t["id"] for t in got.batch.tasks] == p0[1:3]
    assert got.batch.left_ms == T0 + 200 - (T0 + 100)  # the first P0 task's start-by time
    for tid in (*p1, p0[3], other_handler):
        assert queue.record(tid).state is State.QUEUED
    assert queue.redis.smembers(queue.keys.worker_tasks("w1")) == set(p0[:3])
    tokens = {got.task["token"], *(t["token"] for t in got.batch.tasks)}
    assert len(tokens) == 3
    for t in got.batch.tasks:  # what the first shares with them is sent once
        assert (t["handler"], t["model"], t["priority"], t["started_at"]) == ("emb", "A", "0", str(T0 + 100))
        assert t["payload"] == queue.redis.hget(queue.keys.task(t["id"]), "payload")
    # the queue's head in the index moved past the batch
    assert queue.redis.zrange(queue.keys.queue(0, "A"), 0, -1) == sorted([p0[3], other_handler],
        key=lambda t: (queue.redis.zscore(queue.keys.queue(0, "A"), t), t))
    _, head = queue.redis.zrange(queue.keys.queue(0, "A"), 0, 0, withscores=True)[0]
    assert queue.redis.zscore(queue.keys.models_with_work, member(0, "A")) == score(0, head)


def test_a_claim_s_batch_follows_claim_batch_s_rules(queue: Queue) -> None:
    small = batch_ids(queue, 2, vram_gb=4)  # 2 GB of working memory each beside the 2 GB model
    big = enqueue(queue, T0 + 5, handler="emb", priority="P1", vram_gb=9)
    tail = enqueue(queue, T0 + 6, handler="emb", priority="P1", vram_gb=3)
    got = batch_claim(queue, free=5.5)  # 3.5 GB left beside the first
    assert got.task is not None and got.task["id"] == small[0]
    assert got.batch is not None and [t["id"] for t in got.batch.tasks] == [small[1], tail]
    assert queue.record(big).state is State.QUEUED


def test_a_claim_s_batch_counts_each_dispatch_for_fairness(make_queue: object) -> None:
    q = make_queue(fair_every=5)  # type: ignore[operator]
    batch_ids(q, 4, "P0")
    enqueue(q, T0, handler="other", priority="P3", model="B")
    got = batch_claim(q)
    assert got.batch is not None and len(got.batch.tasks) == 3
    assert q.redis.hget(q.keys.fairness, "3") == "4"


def test_no_batch_is_tried_for_a_cold_start_or_another_handler(queue: Queue) -> None:
    batch_ids(queue, 3)
    cold = claim_reply(queue, "w1", 40, now_ms=T0 + 100, batches=[("emb", 31)])
    assert cold.task is not None and cold.batch is None  # its load comes first: claim_batch
    enqueue(queue, T0, handler="gen", priority="P0")
    other = claim_reply(queue, "w2", 40, loaded=HELD, now_ms=T0 + 100, batches=[("emb", 31)])
    assert other.task is not None and other.task["handler"] == "gen" and other.batch is None
    none_more = claim_reply(queue, "w3", 40, loaded=HELD, now_ms=T0 + 100, batches=[("emb", 0)])
    assert none_more.batch is not None and none_more.batch.tasks == []
    assert queue.redis.zcard(queue.keys.queue(1, "A")) == 1


def test_the_idle_score_drops_by_the_memory_the_claim_s_batch_uses(queue: Queue) -> None:
    batch_ids(queue, 3, vram_gb=5)  # 3 GB each beside the 2 GB model
    got = batch_claim(queue, slots=2)
    assert got.batch is not None and len(got.batch.tasks) == 2
    assert queue.redis.zscore(queue.keys.idle, "w1") == 31


def test_malformed_batch_handler_arguments_are_invalid(queue: Queue) -> None:
    batch_ids(queue, 2)
    call = queue.calls.claim(ClaimRequest("w1", 40, 0, 1, HELD, batches=(("emb", 3),)), now_ms=T0 + 100)
    k = call.args.index("emb") - 1
    for i, bad in ((k, "x"), (k, "3"), (k + 1, ""), (k + 2, "-1"), (k + 2, "1e5")):
        args = list(call.args)
        args[i] = bad
        reply = queue.scripts.run_raw(Call(call.script, args, call.parse))
        assert reply[0] == 1, (i, bad, reply)
    assert queue.redis.zcard(queue.keys.queue(1, "A")) == 2


def test_a_batch_reads_its_queue_a_page_at_a_time_past_stale_ids(queue: Queue) -> None:
    ids = batch_ids(queue, 9)
    c = first(queue)
    for tid in ids[1:6]:  # five stale ids: the first page (count + 4 = 6 ids) takes one task
        queue.redis.delete(queue.keys.task(tid))
    got = claim_batch(queue, "w1", c, 40, 2, count=2, now_ms=T0 + 100)
    assert [t["id"] for t in got.tasks] == ids[6:8]  # the second page, read past the first
    assert queue.redis.zrange(queue.keys.queue(1, "A"), 0, -1) == [ids[8]]
