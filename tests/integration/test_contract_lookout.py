"""Contract suite: one idle worker of a shape looks again when a deferral ends (lib/lookout.lua).

Runs on fakeredis and on the real server (the ``backend`` fixture). The scene: an idle
holder of model A, two idle cold workers of one shape (70 GB claimable, every level, one
GPU), and a P2 task of A offered to the holder, so the cold workers leave it until its
deferral (2 s) ends.
"""

from __future__ import annotations

from helpers import T0, claim, claim_reply, enqueue

from gpuq import Queue
from gpuq.claims import ClaimRequest

SHAPE = "70 0123 1"  # claimable GB, levels, GPUs


def scene(q: Queue) -> str:
    assert claim(q, "holder", 10, loaded=[("A", 8)], now_ms=T0) is None
    q.redis.sadd(q.keys.holders("A"), "holder")
    for w in ("c1", "c2"):
        assert claim(q, w, 70, now_ms=T0) is None
    return enqueue(q, T0 + 10, vram_gb=9, priority="P2")  # offered to the holder, woken


def test_one_idle_worker_of_a_shape_is_told_to_look_again(queue: Queue) -> None:
    scene(queue)
    first = claim_reply(queue, "c1", 70, now_ms=T0 + 11)
    # its deferral ends at T0 + 2010: the time to look again is rounded up to 100 ms
    assert first.task is None and first.retry_s == 2.089
    assert queue.redis.hget(queue.keys.lookouts, SHAPE) == f"{T0 + 2100} c1"
    # c2 would look at the same time: c1 does, and c2 waits for its wake-ups
    second = claim_reply(queue, "c2", 70, now_ms=T0 + 12)
    assert second.task is None and second.retry_s == 0
    assert queue.redis.zscore(queue.keys.idle, "c2") == 70
    # a worker of another shape (less room) has its own lookout
    other = claim_reply(queue, "c3", 60, now_ms=T0 + 13)
    assert other.retry_s == 2.087
    assert queue.redis.hget(queue.keys.lookouts, "60 0123 1") == f"{T0 + 2100} c3"


def test_a_lookout_no_longer_idle_or_due_later_is_replaced(queue: Queue) -> None:
    scene(queue)
    assert claim_reply(queue, "c1", 70, now_ms=T0 + 11).retry_s > 0
    queue.redis.zrem(queue.keys.idle, "c1")  # woken (or handed a task): it may not come
    assert claim_reply(queue, "c2", 70, now_ms=T0 + 12).retry_s == 2.088
    assert queue.redis.hget(queue.keys.lookouts, SHAPE) == f"{T0 + 2100} c2"
    # a lookout due after this claim's own time to look is replaced too
    queue.redis.hset(queue.keys.lookouts, SHAPE, f"{T0 + 9999} c2")
    assert claim_reply(queue, "c1", 70, now_ms=T0 + 14).retry_s == 2.086
    assert queue.redis.hget(queue.keys.lookouts, SHAPE) == f"{T0 + 2100} c1"


def test_a_lookout_that_takes_a_task_passes_the_duty_and_one_with_nothing_left_drops_it(
        queue: Queue) -> None:
    tid = scene(queue)
    assert claim_reply(queue, "c1", 70, now_ms=T0 + 11).retry_s > 0
    assert claim_reply(queue, "c2", 70, now_ms=T0 + 12).retry_s == 0
    taken = claim_reply(queue, "c1", 70, now_ms=T0 + 2010, lookout=True)
    assert taken.task is not None and taken.task["id"] == tid  # deferral over: taken cold
    # c2 is woken as the lookout, now: it takes the next task whose deferral ended, if any
    assert queue.redis.lrange(queue.keys.wake("c2"), 0, -1) == ["look"]
    assert queue.redis.zscore(queue.keys.idle, "c2") is None
    assert queue.redis.hget(queue.keys.lookouts, SHAPE) == f"{T0 + 2010} c2"
    nothing = claim_reply(queue, "c2", 70, now_ms=T0 + 2011, lookout=True)
    assert nothing.task is None and nothing.retry_s == 0
    assert queue.redis.hget(queue.keys.lookouts, SHAPE) is None


def test_the_duty_passes_only_to_a_worker_of_the_same_shape(queue: Queue) -> None:
    tid = scene(queue)
    queue.redis.zrem(queue.keys.idle, "c2")
    assert claim(queue, "lane", 70, levels="01", now_ms=T0 + 5) is None  # serves P0/P1 only
    assert claim_reply(queue, "c1", 70, now_ms=T0 + 11).retry_s > 0
    taken = claim_reply(queue, "c1", 70, now_ms=T0 + 2010, lookout=True)
    assert taken.task is not None and taken.task["id"] == tid
    assert queue.redis.llen(queue.keys.wake("lane")) == 0  # not of c1's shape: not woken
    assert queue.redis.hget(queue.keys.lookouts, SHAPE) is None


def test_a_lookout_that_retires_passes_the_duty(queue: Queue) -> None:
    scene(queue)
    queue.redis.zadd(queue.keys.workers, {w: T0 + 10**9 for w in ("holder", "c1", "c2")})
    assert claim_reply(queue, "c1", 70, now_ms=T0 + 11).retry_s > 0
    assert queue.scripts.run(queue.calls.retire("c1", now_ms=T0 + 20))[0]
    assert queue.redis.lrange(queue.keys.wake("c2"), 0, -1) == ["look"]
    assert queue.redis.hget(queue.keys.lookouts, SHAPE) == f"{T0 + 20} c2"


def test_an_unlisted_worker_is_not_taken_out_of_idle_again(queue: Queue) -> None:
    """ARGV 19 = "2": a one-slot worker whose last claim gave it a task says it is not in
    `idle`, and its claim writes nothing there; with "0" the claim takes it out."""
    q = queue
    first, second = enqueue(q, T0, model="A"), enqueue(q, T0, model="A")

    def take(unlisted: bool) -> str:
        req = ClaimRequest("w1", 40.0, 0.0, 1, unlisted=unlisted)
        got = q.scripts.run(q.calls.claim(req, now_ms=T0 + 1)).task
        assert got is not None
        return got["id"]

    q.redis.zadd(q.keys.idle, {"w1": 40})  # as if listed: the flag is what the claim goes by
    assert take(True) == first and q.redis.zscore(q.keys.idle, "w1") == 40
    assert take(False) == second and q.redis.zscore(q.keys.idle, "w1") is None


def test_the_reaper_drops_lookouts_long_past_due(queue: Queue) -> None:
    """The defect: only a claim of the same shape replaced a lookout, so the entries of dead
    workers and of shapes gone (free VRAM moves with what a worker runs) stayed forever."""
    from gpuq.clock import server_ms
    from gpuq.reaper.loop import STALE_LOOKOUT_MS, Reaper

    now = server_ms(queue.redis)
    queue.redis.hset(queue.keys.lookouts, mapping={
        "12.5 0123 1": f"{now - STALE_LOOKOUT_MS - 1000} w-dead", "70 01 1": f"{now + 500} w-live",
        "8 0123 2": f"{now - 5000} w-late", "9 0123 1": "garbage"})
    assert Reaper(queue.redis, queue.config).prune_lookouts() == 2
    assert set(queue.redis.hkeys(queue.keys.lookouts)) == {"70 01 1", "8 0123 2"}


def test_a_worker_skipping_a_model_is_never_its_shapes_lookout(queue: Queue) -> None:
    """Regression: a worker whose claims skip a model (its load failed there) became its
    shape's lookout, or was passed the duty, and the other idle workers of the shape counted
    on it to look again for a deferred task of that model, whose queues it never scans: they
    took the task only at their next wake-up."""
    tid = scene(queue)
    skipping = ClaimRequest("c1", 70, 0, 1, skipped=(("B", 30_000),))
    first = queue.scripts.run(queue.calls.claim(skipping, now_ms=T0 + 11))
    assert first.task is None and first.retry_s == 2.089  # it looks again for its own queues
    assert queue.redis.hget(queue.keys.lookouts, SHAPE) is None  # but keeps no duty
    assert claim_reply(queue, "c2", 70, now_ms=T0 + 12).retry_s == 2.088  # c2 is the lookout
    assert queue.redis.hget(queue.keys.lookouts, SHAPE) == f"{T0 + 2100} c2"
    # c2 takes the task at its deferral's end; the duty does not pass to the skipping c1
    taken = claim_reply(queue, "c2", 70, now_ms=T0 + 2010, lookout=True)
    assert taken.task is not None and taken.task["id"] == tid
    assert queue.redis.llen(queue.keys.wake("c1")) == 0
    assert queue.redis.hget(queue.keys.lookouts, SHAPE) is None
