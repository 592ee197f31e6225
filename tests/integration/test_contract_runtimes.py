"""Contract suite, part 5: run times learned from successful runs, and the estimate of a task
enqueued without one.

Workers measure each successful run's handler time and send them with their heartbeat to
learn.lua, which adds each to ``runtimes`` for its handler and model (a decayed mean and p90);
ack learns nothing. enqueue gives a task sent with est_s "" that mean, else 1 s. Each test
runs on fakeredis and on the real server (the ``backend`` fixture).
"""

from __future__ import annotations

import pytest
from helpers import T0, ack, claim, enqueue, raw_enqueue_call

from gpuq import Queue
from gpuq.errors import InvalidTask
from gpuq.scripts import LEARN_MAX_RUNS, Call
from gpuq.views.inspect import learned_runtimes, pool_view

PAIR = "h m"  # handler h, model m: the runtimes field


def stored(q: Queue, pair: str = PAIR) -> tuple[float, float, int] | None:
    v = q.redis.hget(q.keys.runtimes, pair)
    if v is None:
        return None
    mean, p90, n = v.split(" ")
    return float(mean), float(p90), int(n)


def learn(q: Queue, *seconds: float, handler: str = "h", model: str = "m") -> int:
    """Send runs of one pair in one call; the reply's count of runs recorded."""
    return q.scripts.run(q.calls.learn([(handler, model, x) for x in seconds]))


def raw(q: Queue, *argv: str) -> list[object]:
    """learn.lua's reply to ARGV as given."""
    return list(q.scripts.run_raw(Call("learn", list(argv), list)))


def reference(samples: list[float]) -> tuple[float, float]:
    """learn.lua's rule: decayed mean (weight max(0.1, 1/n)); p90 the largest of the first 10
    runs, then stepped by weight × mean."""
    mean = p90 = samples[0]
    for n, x in enumerate(samples[1:], start=2):
        a = max(0.1, 1 / n)
        mean += a * (x - mean)
        if n <= 10:
            p90 = max(p90, x)
        else:
            p90 = p90 + 0.9 * a * mean if x > p90 else max(0.0, p90 - 0.1 * a * mean)
    return mean, p90


def test_a_few_runs_never_show_a_p90_below_each_of_them(queue: Queue) -> None:
    """Found by a handler author: two runs of about 0.604 s showed a p90 of 0.5737."""
    for x in (0.6036, 0.6035):
        learn(queue, x)
    mean, p90, n = stored(queue) or (0, 0, 0)
    assert (n, p90) == (2, 0.6036) and p90 >= mean


def test_the_first_run_sets_mean_and_p90_and_later_runs_follow_the_rule(queue: Queue) -> None:
    assert stored(queue) is None
    assert learn(queue, 2.5) == 1
    assert stored(queue) == (2.5, 2.5, 1)
    samples = [2.5] + [0.5 + (i * 7 % 10) / 2 for i in range(40)]
    for x in samples[1:]:
        learn(queue, x)
    mean, p90, n = stored(queue) or (0, 0, 0)
    want_mean, want_p90 = reference(samples)
    assert n == len(samples)
    assert mean == pytest.approx(want_mean, rel=1e-4) and p90 == pytest.approx(want_p90, rel=1e-4)


def test_one_call_of_many_runs_follows_the_rule_run_by_run(queue: Queue) -> None:
    """Runs are added in the order sent, other pairs' runs in between; within a call the
    numbers are not rounded between runs, so the stored value is the rule's, to %.6g."""
    h = [0.5 + (i * 7 % 10) / 3 for i in range(60)]
    runs = [("h", "m", x) for x in h]
    runs[10:10] = [("g", "m", 4.0), ("h", "n", 1e-7), ("g", "m", 0.0)]
    queue.redis.hset(queue.keys.runtimes, "g m", "x")  # malformed: starts afresh
    assert queue.scripts.run(queue.calls.learn(runs)) == len(runs)
    for pair, samples in (("h m", h), ("g m", [4.0, 0.0]), ("h n", [1e-7])):
        mean, p90, n = stored(queue, pair) or (0, 0, 0)
        want_mean, want_p90 = reference(samples)
        assert n == len(samples), pair
        assert mean == pytest.approx(want_mean, rel=1e-5) and p90 == pytest.approx(want_p90, rel=1e-5)
    batched = stored(queue) or (0, 0, 0)
    queue.redis.delete(queue.keys.runtimes)
    for x in h:  # one call per run: rounded to %.6g between runs, the same to about 1e-5
        learn(queue, x)
    one_by_one = stored(queue) or (0, 0, 0)
    assert one_by_one[2] == batched[2] and one_by_one[:2] == pytest.approx(batched[:2], rel=1e-4)


def test_the_p90_settles_where_one_run_in_ten_lies_above_it(queue: Queue) -> None:
    learn(queue, *[1 + i * 7 % 10 for i in range(LEARN_MAX_RUNS)])  # 1..10 s, evenly
    learn(queue, *[1 + i * 7 % 10 for i in range(44)])
    mean, p90, n = stored(queue) or (0, 0, 0)
    assert n == 300 and 4 < mean < 7 and 8 <= p90 <= 10.5


def test_pairs_are_kept_apart_and_malformed_values_start_afresh(queue: Queue) -> None:
    learn(queue, 1.0)
    learn(queue, 4.0, handler="g")
    assert stored(queue) == (1.0, 1.0, 1) and stored(queue, "g m") == (4.0, 4.0, 1)
    for bad in ("nan 1 x", "1e11 1 1", "2 2", "-1 1 1"):
        queue.redis.hset(queue.keys.runtimes, PAIR, bad)
        learn(queue, 2.0, 4.0)  # the first run starts afresh, the second follows it
        assert stored(queue) == (3.0, 4.0, 2)  # the larger of two runs


def test_a_new_pair_past_the_cap_is_not_recorded(queue: Queue) -> None:
    queue.redis.hset(queue.keys.runtimes, mapping={f"h{i} m": "1 1 1" for i in range(4095)})
    # one new pair still fits; the next new one does not, in the same call or later
    reply = queue.scripts.run(queue.calls.learn([("a", "m", 2.0), ("b", "m", 2.0), ("a", "m", 2.0),
                                                 ("b", "m", 2.0), ("h7", "m", 2.0)]))
    assert reply == 3
    assert stored(queue, "a m") == (2.0, 2.0, 2) and stored(queue, "b m") is None
    assert stored(queue, "h7 m") == (1.5, 2.0, 2)  # a known pair still learns
    assert learn(queue, 2.0, handler="c") == 0 and stored(queue, "c m") is None
    assert queue.redis.hlen(queue.keys.runtimes) == 4096
    queue.redis.hset(queue.keys.runtimes, "h1 m", "bad")  # a malformed pair is a known one
    assert learn(queue, 5.0, handler="h1") == 1 and stored(queue, "h1 m") == (5.0, 5.0, 1)


def test_at_most_256_runs_per_call(queue: Queue) -> None:
    assert learn(queue, *[1.0] * LEARN_MAX_RUNS) == LEARN_MAX_RUNS == 256
    mean, p90, n = kept = stored(queue) or (0, 0, 0)
    assert mean == 1.0 and n == 256 and p90 == pytest.approx(1.0, abs=0.2)
    with pytest.raises(InvalidTask, match="at most 256 runs per call"):
        learn(queue, *[1.0] * (LEARN_MAX_RUNS + 1))
    assert stored(queue) == kept
    assert raw(queue) == [0, 0]  # no runs: nothing to do


@pytest.mark.parametrize("argv, reason", [
    (["h", "m"], "triples"),
    (["h", "m", "1", "g"], "triples"),
    (["", "m", "1"], "names"),
    (["h", "", "1"], "names"),
    (["h x", "m", "1"], "names"),
    (["h", "m\t", "1"], "names"),
    (["h\n", "m", "1"], "names"),
    (["h", "m", ""], "number"),
    (["h", "m", "x"], "number"),
    (["h", "m", "nan"], "number"),
    (["h", "m", "inf"], "number"),
    (["h", "m", "-inf"], "number"),
    (["h", "m", "1e309"], "number"),
    (["h", "m", "-1"], "number"),
    (["h", "m", "-1e-9"], "number"),
    (["h", "m", "1e11"], "number"),
])
def test_a_malformed_run_rejects_the_call_and_writes_nothing(queue: Queue, argv: list[str],
                                                             reason: str) -> None:
    learn(queue, 1.0)
    before = queue.redis.hgetall(queue.keys.runtimes)
    for call in (argv, ["h", "m", "3", "g", "m", "2", *argv]):  # alone, or after good runs
        reply = raw(queue, *call)
        assert reply[:2] == [1, 0] and reason in str(reply[2]), reply
        assert queue.redis.hgetall(queue.keys.runtimes) == before
    assert raw(queue, "h", "m", "0", "h", "m", "1e10", "h", "m", "2.5")[:2] == [0, 3]  # the bounds


def test_ack_learns_nothing(queue: Queue) -> None:
    """ack.lua records the result only: the run time comes from the worker (learn.lua)."""
    for est in (1, None):
        tid = enqueue(queue, T0, model="m", vram_gb=4, est_s=est)
        c = claim(queue, "w1", 20, loaded=[("m", 4)], now_ms=T0)
        assert c is not None and c["id"] == tid
        ack(queue, tid, c["token"], now_ms=T0 + 5_000)
        assert queue.record(tid).result == "ok"
    assert not queue.redis.exists(queue.keys.runtimes)


def test_enqueue_without_est_s_takes_the_learned_mean(queue: Queue) -> None:
    fresh = enqueue(queue, T0, model="m", vram_gb=4, est_s=None)
    f = queue.redis.hmget(queue.keys.task(fresh), "est_s", "est_from")
    assert f == ["1", None]  # nothing learned yet: 1 s, not marked
    queue.cancel(fresh)
    learn(queue, 3.0, 5.0)
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
    learn(queue, 2.0)
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
        learn(queue, *[1.0] * (i + 1), handler=f"h{i}")
    queue.redis.hset(queue.keys.runtimes, "bad", "1 2 3")  # no model: skipped
    shown = pool_view(queue.redis, queue.keys).runtimes
    assert [(r["handler"], r["samples"]) for r in shown] == [(f"h{i}", i + 1) for i in range(11, 1, -1)]
    assert shown[0]["model"] == "m" and shown[0]["mean_s"] == 1.0
    assert shown[0]["p90_s"] == pytest.approx(1.0, abs=0.3)  # the p90 steps about a constant
    assert learned_runtimes({"a m": "1 2 3", "b m": "1 2"}) == [
        {"handler": "a", "model": "m", "mean_s": 1.0, "p90_s": 2.0, "samples": 3}]
