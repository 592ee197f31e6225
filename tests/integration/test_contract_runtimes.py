"""Contract suite, part 5: run times learned from successful runs, and the estimate of a task
enqueued without one.

ack adds each successful run, from its handler's start to the ack, to ``runtimes`` for its
handler and model (a decayed mean and p90); enqueue gives a task sent with est_s "" that mean,
else 1 s. Each test runs on fakeredis and on the real server (the ``backend`` fixture).
"""

from __future__ import annotations

import pytest
from helpers import T0, ack, claim, enqueue, fail, raw_enqueue_call

from gpuq import Queue
from gpuq.views.inspect import learned_runtimes, pool_view

PAIR = "h m"  # handler h, model m: the runtimes field


def stored(q: Queue, pair: str = PAIR) -> tuple[float, float, int] | None:
    v = q.redis.hget(q.keys.runtimes, pair)
    if v is None:
        return None
    mean, p90, n = v.split(" ")
    return float(mean), float(p90), int(n)


def run(q: Queue, seconds: float, at: int = T0, **options: object) -> str:
    """Enqueue, claim warm (its handler starts at the claim) and ack after ``seconds``."""
    tid = enqueue(q, at, model="m", vram_gb=4, est_s=1, **options)
    c = claim(q, "w1", 20, loaded=[("m", 4)], now_ms=at)
    assert c is not None and c["id"] == tid
    ack(q, tid, c["token"], now_ms=at + round(seconds * 1000))
    return tid


def reference(samples: list[float]) -> tuple[float, float]:
    """lib/runtime.lua's rule: decayed mean (weight max(0.1, 1/n)); p90 stepped by weight × mean."""
    mean = p90 = samples[0]
    for n, x in enumerate(samples[1:], start=2):
        a = max(0.1, 1 / n)
        mean += a * (x - mean)
        p90 = p90 + 0.9 * a * mean if x > p90 else max(0.0, p90 - 0.1 * a * mean)
    return mean, p90


def test_the_first_run_sets_mean_and_p90_and_later_runs_follow_the_rule(queue: Queue) -> None:
    assert stored(queue) is None
    run(queue, 2.5)
    assert stored(queue) == (2.5, 2.5, 1)
    samples = [2.5] + [0.5 + (i * 7 % 10) / 2 for i in range(40)]
    for x in samples[1:]:
        run(queue, x)
    mean, p90, n = stored(queue) or (0, 0, 0)
    want_mean, want_p90 = reference(samples)
    assert n == len(samples)
    assert mean == pytest.approx(want_mean, rel=1e-4) and p90 == pytest.approx(want_p90, rel=1e-4)


def test_the_p90_settles_where_one_run_in_ten_lies_above_it(queue: Queue) -> None:
    for i in range(300):
        run(queue, 1 + i * 7 % 10)  # 1..10 s, evenly: the 0.9 quantile is 9 to 10
    mean, p90, _ = stored(queue) or (0, 0, 0)
    assert 4 < mean < 7 and 8 <= p90 <= 10.5


def test_a_cold_start_counts_from_its_handler_start(queue: Queue) -> None:
    tid = enqueue(queue, T0, model="m", vram_gb=4)
    c = claim(queue, "w1", 20, now_ms=T0)  # the model not held: the worker loads it first
    assert c is not None and c["sla"] == "pending"
    queue.scripts.run(queue.calls.began(tid, int(c["token"]), now_ms=T0 + 30_000))
    ack(queue, tid, c["token"], now_ms=T0 + 32_000)
    assert stored(queue) == (2.0, 2.0, 1)


def test_a_later_cold_start_counts_from_the_expected_load_end(queue: Queue) -> None:
    """began_at is written once: a second run started cold counts from its ready_at."""
    queue.redis.hset(queue.keys.catalog_model("m"), mapping={"loads": 1, "total_load_s": 10})
    tid = enqueue(queue, T0, model="m", vram_gb=4)
    c = claim(queue, "w1", 20, now_ms=T0)
    assert c is not None
    queue.scripts.run(queue.calls.began(tid, int(c["token"]), now_ms=T0 + 9_000))
    fail(queue, tid, c["token"], now_ms=T0 + 9_500)  # retried: no sample
    assert stored(queue) is None
    queue.scripts.run(queue.calls.reap(now_ms=T0 + 60_000))  # promotes the due retry
    c = claim(queue, "w2", 20, now_ms=T0 + 60_000)
    assert c is not None and c["id"] == tid
    assert queue.redis.hget(queue.keys.task(tid), "ready_at") == str(T0 + 70_000)
    ack(queue, tid, c["token"], now_ms=T0 + 73_000)
    assert stored(queue) == (3.0, 3.0, 1)


def test_failed_and_stale_runs_teach_nothing(queue: Queue) -> None:
    tid = enqueue(queue, T0, model="m", vram_gb=4, max_attempts=1)
    c = claim(queue, "w1", 20, loaded=[("m", 4)], now_ms=T0)
    assert c is not None
    fail(queue, tid, c["token"], retry=False, now_ms=T0 + 5_000)
    assert stored(queue) is None and queue.redis.hlen(queue.keys.runtimes) == 0


def test_pairs_are_kept_apart_and_malformed_values_start_afresh(queue: Queue) -> None:
    run(queue, 1.0)
    run(queue, 4.0, handler="g")
    assert stored(queue) == (1.0, 1.0, 1) and stored(queue, "g m") == (4.0, 4.0, 1)
    queue.redis.hset(queue.keys.runtimes, PAIR, "nan 1 x")
    run(queue, 2.0)
    assert stored(queue) == (2.0, 2.0, 1)


def test_a_new_pair_past_the_cap_is_not_recorded(queue: Queue) -> None:
    queue.redis.hset(queue.keys.runtimes, mapping={f"h{i} m": "1 1 1" for i in range(4096)})
    run(queue, 2.0)
    assert stored(queue) is None
    run(queue, 2.0, handler="h7")  # a known pair still learns
    assert stored(queue, "h7 m") == (1.5, 1 + 0.9 * 0.5 * 1.5, 2)  # 2 s > the p90: up


def test_enqueue_without_est_s_takes_the_learned_mean(queue: Queue) -> None:
    fresh = enqueue(queue, T0, model="m", vram_gb=4, est_s=None)
    f = queue.redis.hmget(queue.keys.task(fresh), "est_s", "est_from")
    assert f == ["1", None]  # nothing learned yet: 1 s, not marked
    queue.cancel(fresh)
    run(queue, 3.0)
    run(queue, 5.0)
    tid = enqueue(queue, T0, model="m", vram_gb=4, est_s=None, deadline_s=60)
    t = queue.redis.hgetall(queue.keys.task(tid))
    assert (t["est_s"], t["est_from"]) == ("4", "history")
    assert int(t["score"]) == T0 + 60_000 - 4_000  # start-by: deadline - the learned estimate
    assert queue.redis.zscore(queue.keys.deadlines, tid) == T0 + 60_000 - 4_000
    assert queue.record(tid).est_from == "history" and queue.record(tid).est_s == 4.0
    given = enqueue(queue, T0, model="m", vram_gb=4, est_s=0.5)
    assert queue.redis.hmget(queue.keys.task(given), "est_s", "est_from") == ["0.5", None]
    other = enqueue(queue, T0, model="n", vram_gb=4, est_s=None)  # another model: nothing learned
    assert queue.redis.hget(queue.keys.task(other), "est_s") == "1"


def test_a_bulk_enqueue_gives_each_task_of_a_pair_the_mean(queue: Queue) -> None:
    run(queue, 2.0)
    tasks = queue.enqueue_many([{"handler": "h", "model": "m", "vram_gb": 1},
                                {"handler": "h", "model": "m", "vram_gb": 1, "est_s": 7},
                                {"handler": "h", "model": "m", "vram_gb": 1}])
    got = [queue.redis.hmget(queue.keys.task(t.id), "est_s", "est_from") for t in tasks]
    assert got == [["2", "history"], ["7", None], ["2", "history"]]


@pytest.mark.parametrize("value", ["nan 1 1", "-1 1 1", "1e11 1 1", "2 2", "x"])
def test_a_malformed_learned_value_falls_back_to_one_second(queue: Queue, value: str) -> None:
    queue.redis.hset(queue.keys.runtimes, "h A", value)
    tid, call = raw_enqueue_call(queue, est_s="")
    assert queue.scripts.run(call) == 1
    assert queue.redis.hmget(queue.keys.task(tid), "est_s", "est_from") == ["1", None]


def test_status_shows_the_pairs_with_the_most_runs(queue: Queue) -> None:
    for i in range(12):
        for _ in range(i + 1):
            run(queue, 1.0, handler=f"h{i}")
    queue.redis.hset(queue.keys.runtimes, "bad", "1 2 3")  # no model: skipped
    shown = pool_view(queue.redis, queue.keys).runtimes
    assert [(r["handler"], r["samples"]) for r in shown] == [(f"h{i}", i + 1) for i in range(11, 1, -1)]
    assert shown[0]["model"] == "m" and shown[0]["mean_s"] == 1.0
    assert shown[0]["p90_s"] == pytest.approx(1.0, abs=0.3)  # the p90 steps about a constant
    assert learned_runtimes({"a m": "1 2 3", "b m": "1 2"}) == [
        {"handler": "a", "model": "m", "mean_s": 1.0, "p90_s": 2.0, "samples": 3}]
