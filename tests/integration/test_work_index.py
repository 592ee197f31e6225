"""The work index: one sorted set over the levels (gpuq/work_index.py, lib/queue.lua).

Runs on fakeredis and on the real server (``backend``); the read counts use the real
server's command stats.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import resources

from helpers import T0, ack, claim, enqueue, reap

from gpuq import Queue, work_index
from gpuq.work_index import member, score

MakeQueue = Callable[..., Queue]


def test_lua_and_python_agree_on_the_level_span() -> None:
    text = resources.files("gpuq").joinpath("lua", "lib", "queue.lua").read_text()
    found = re.search(r"^local LEVEL_SPAN = (\S+)$", text, re.M)
    assert found and float(found[1]) == work_index.LEVEL_SPAN


def test_members_lie_by_level_then_head_score(queue: Queue) -> None:
    enqueue(queue, T0 + 50, model="B", priority="P3")
    enqueue(queue, T0 + 40, model="A", priority="P2")
    enqueue(queue, T0 + 30, model="B", priority="P2")
    enqueue(queue, T0 + 20, model="A", priority="P0")
    entries = queue.redis.zrange(queue.keys.models_with_work, 0, -1, withscores=True)
    assert [work_index.split(e) for e, _ in entries] == [(0, "A"), (2, "B"), (2, "A"), (3, "B")]
    heads = {work_index.split(e): s for e, s in entries}
    # each score is its level's offset plus its queue's head score, exactly
    for (p, m), s in heads.items():
        head = queue.redis.zrange(queue.keys.queue(p, m), 0, 0, withscores=True)[0][1]
        assert s == score(p, head)
    pipe = queue.redis.pipeline(transaction=False)
    for p in range(4):
        work_index.read_level(pipe, queue.keys, p)
    assert [work_index.models(r) for r in pipe.execute()] == [["A"], [], ["B", "A"], ["B"]]


def test_a_model_name_with_the_separator_round_trips(queue: Queue) -> None:
    enqueue(queue, T0, model="org:model:v2", priority="P1")
    c = claim(queue, "w1", 40, now_ms=T0 + 1)
    assert c is not None and c["model"] == "org:model:v2"
    assert queue.redis.zcard(queue.keys.models_with_work) == 0


def test_levels_the_index_ends_show_are_not_read_again(real_queue: Queue) -> None:
    """With P2 work in fewer than four queues, a claim learns from one read of the index's
    first members that P0, P1 and P3 have none: before, it read each level's index and
    checked P3's for the fairness count."""
    q = real_queue
    for i in range(3):
        enqueue(q, T0 + i, model="A", priority="P2")

    def reads() -> dict[str, int]:
        stats = q.redis.info("commandstats")
        return {c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("zrange", "exists")}

    before = reads()
    c = claim(q, "w1", 40, now_ms=T0 + 10)
    after = reads()
    assert c is not None and c["priority"] == "2"
    # zrange: the index's first members, the queue's head (hand-overs and tenants: the gates
    # in `fair` say there are none, lib/gates.lua)
    assert {k: after[k] - before[k] for k in after} == {"zrange": 2, "exists": 0}
    ack(q, c["id"], c["token"], now_ms=T0 + 11)


def test_a_held_model_is_claimed_without_reading_its_levels_page(real_queue: Queue) -> None:
    """An index of more than four queues whose first and last members are P2 says P2 has work
    and no other level has: a worker holding one of its models takes its task without reading
    P2's page of the index, and the fairness count reads nothing for P3 (before: a first page
    of 16 members parsed, then P3's first member read, as a page full of P2 could not tell)."""
    q = real_queue
    for i in range(17):
        enqueue(q, T0 + i, model=f"m{i:02}", priority="P2", vram_gb=20)

    def reads() -> dict[str, int]:
        stats = q.redis.info("commandstats")
        return {c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("zrange", "zrangebyscore")}

    before = reads()
    c = claim(q, "w1", 40, loaded=[("m05", 20.0)], now_ms=T0 + 100)
    after = reads()
    assert c is not None and c["model"] == "m05"
    # zrange: the index's two ends, the held queue's head
    assert {k: after[k] - before[k] for k in after} == {"zrange": 3, "zrangebyscore": 0}


def test_a_level_past_a_full_first_page_is_read(queue: Queue) -> None:
    for i in range(16):  # a first page of P1 models only: P3's work is beyond it
        enqueue(queue, T0 + i, model=f"m{i:02}", priority="P1", vram_gb=500)
    enqueue(queue, T0 + 100, model="late", priority="P3")
    c = claim(queue, "w1", 40, now_ms=T0 + 200)
    assert c is not None and (c["priority"], c["model"]) == ("3", "late")


def test_the_fairness_count_reads_the_levels_between_the_index_ends(queue: Queue) -> None:
    """Work at P0, P2 and P3: the index's ends say P0 and P3 have work, not what lies
    between; a P0 dispatch counts for P2 and P3 only, as one read of the index from P1 on
    tells (P1 has none)."""
    enqueue(queue, T0, model="A", priority="P0")
    enqueue(queue, T0 + 1, model="B", priority="P2")
    enqueue(queue, T0 + 2, model="C", priority="P3")
    c = claim(queue, "w1", 40, loaded=[("A", 20.0)], now_ms=T0 + 10)
    assert c is not None and c["priority"] == "0"
    assert queue.redis.hmget(queue.keys.fairness, "1", "2", "3") == [None, "1", "1"]


def test_reap_moves_an_older_release_s_per_level_index_into_it(queue: Queue) -> None:
    """A task an older client queued is indexed in models:<p>: the reaper's next reap moves
    it here (the lower head score winning), and a claim finds it."""
    k, r = queue.keys, queue.redis
    old_id = enqueue(queue, T0, model="A", priority="P1")
    r.zrem(k.models_with_work, member(1, "A"))  # as the older release wrote it
    r.zadd(k.legacy_models_with_work(1), {"A": T0 + 1000})
    newer = enqueue(queue, T0 + 20, model="A", priority="P1")  # a newer client indexes it too
    assert r.zscore(k.models_with_work, member(1, "A")) == score(1, T0 + 20 + 1000)
    reap(queue, now_ms=T0 + 30)
    assert r.exists(k.legacy_models_with_work(1)) == 0
    assert r.zscore(k.models_with_work, member(1, "A")) == score(1, T0 + 1000)
    got = [claim(queue, w, 40, now_ms=T0 + 40) for w in ("w1", "w2")]
    assert [c and c["id"] for c in got] == [old_id, newer]
