"""Contract suite: what a run's end (fail, cancel, an operator's requeue, retire) leaves behind.

Runs on fakeredis and on the real server (``backend``); the long chain on the real server
only (``real_queue``). A yield asked of a run does not outlive it; a parent run again is
waited for again by its waiting children; a result TTL of 0 still settles children and
streams; a chain of any length is canceled whole; a progress report is stored as text any
reader takes; a canceled hand-over leaves its worker's wake list; a retired worker holds
no model and leaves nothing that never expires.
"""

from __future__ import annotations

from conftest import MakeQueue
from helpers import T0, ack, claim, enqueue, fail, heartbeat, reap, register_worker, spec

from gpuq import Queue
from gpuq.call import Call


def preempt(q: Queue, waiting: str, worker: str, victim: str, token: str, now_ms: int) -> tuple[str, str]:
    return q.scripts.run(q.calls.preempt(waiting, worker, victim, int(token), reserve_ms=60_000,
                                         grace_ms=5_000, now_ms=now_ms))


def asked_to_yield(q: Queue) -> tuple[str, str, str, int]:
    """A P3 victim running on w1, asked to yield for a P0 task: (victim, token, waiting, now)."""
    register_worker(q, "w1", idle=True)
    v = enqueue(q, T0, model="A", vram_gb=10, priority=3)
    t = claim(q, "w1", 75, now_ms=T0 + 1)
    assert t is not None and t["id"] == v
    heartbeat(q, "w1", [(v, t["token"])], now_ms=T0 + 2)
    w = enqueue(q, T0 + 3, model="B", vram_gb=70, priority=0)
    assert preempt(q, w, "w1", v, t["token"], T0 + 4)[0] == "yield"
    return v, t["token"], w, T0 + 5


def preempt_again(q: Queue, v: str, now_ms: int) -> tuple[str, str]:
    """The victim's next run, claimed on w1, asked to yield for another P0 task."""
    q.redis.zadd(q.keys.idle, {"w1": 75})
    t = claim(q, "w1", 75, now_ms=now_ms)
    assert t is not None and t["id"] == v
    assert not q.redis.hget(q.keys.task(v), "yield_by")
    heartbeat(q, "w1", [(v, t["token"])], now_ms=now_ms + 1)
    w = enqueue(q, now_ms + 2, model="B", vram_gb=70, priority=0)
    return preempt(q, w, "w1", v, t["token"], now_ms + 3)


def test_a_victim_that_fails_may_be_asked_to_yield_again(queue: Queue) -> None:
    v, token, w, now = asked_to_yield(queue)
    assert fail(queue, v, token, retry=True, now_ms=now) == "delayed"
    queue.scripts.run(queue.calls.cancel(w, now_ms=now + 1))
    assert preempt_again(queue, v, now + 600_000)[0] == "yield"


def test_a_canceled_victim_requeued_by_an_operator_may_be_asked_to_yield_again(queue: Queue) -> None:
    v, _, w, now = asked_to_yield(queue)
    queue.scripts.run(queue.calls.cancel(v, now_ms=now))
    queue.scripts.run(queue.calls.requeue(v, None, "again", now_ms=now + 1))
    queue.scripts.run(queue.calls.cancel(w, now_ms=now + 2))
    assert preempt_again(queue, v, now + 3)[0] == "yield"


def test_a_parent_run_again_is_waited_for_again(queue: Queue) -> None:
    p1 = enqueue(queue, T0, model="A", max_attempts=1)
    p2 = enqueue(queue, T0, model="B")
    c = enqueue(queue, T0, model="A", after=[p1, p2], after_any_outcome=True)
    t = claim(queue, "w1", 75, now_ms=T0 + 1, loaded=[("A", 1)])
    assert t is not None and t["id"] == p1
    assert fail(queue, p1, t["token"], retry=False, now_ms=T0 + 2) == "failed"
    assert queue.redis.hget(queue.keys.task(c), "pending") == "1"
    assert queue.redis.pttl(queue.keys.children(p1)) > 0
    queue.scripts.run(queue.calls.requeue(p1, None, "again", now_ms=T0 + 3))
    # the child waits for the parent's next end as well as for p2; the set lives while it waits
    assert queue.redis.hmget(queue.keys.task(c), "state", "pending") == ["waiting", "2"]
    assert queue.redis.pttl(queue.keys.children(p1)) == -1
    t = claim(queue, "w1", 75, now_ms=T0 + 4, loaded=[("A", 1)])
    assert t is not None and t["id"] == p1
    ack(queue, p1, t["token"], now_ms=T0 + 5)
    assert queue.redis.hmget(queue.keys.task(c), "state", "pending") == ["waiting", "1"]


def test_a_zero_result_ttl_still_settles_children_and_streams(make_queue: MakeQueue) -> None:
    q = make_queue(result_ttl_s=0)
    p = enqueue(q, T0, model="A")
    c = enqueue(q, T0, model="A", after=[p])
    t = claim(q, "w1", 75, now_ms=T0 + 1, loaded=[("A", 1)])
    assert t is not None and t["id"] == p
    q.scripts.run(Call("emit", [p, t["token"], "0", '"x"', "100", "65536"], lambda r: r))
    q.scripts.run(q.calls.cancel(p, now_ms=T0 + 2))
    # both ended (counted), and their TTL of 0 took them, the stream with its end marker
    assert q.redis.hget(q.keys.stats, "canceled:P2") == "2"
    assert q.redis.zscore(q.keys.waiting, c) is None
    assert not any(q.redis.exists(k) for k in (q.keys.task(p), q.keys.task(c), q.keys.stream(p),
                                               q.keys.children(p)))


def test_a_long_chain_is_canceled_whole(real_queue: Queue) -> None:
    """Deeper than Lua's stack would let a recursion go (about 16,000 generations)."""
    q = real_queue
    root = enqueue(q, T0, model="A")
    ids, prev = [root], root
    calls = []
    for _ in range(20_000):
        s = spec(model="A", after=[prev])
        calls.append(q.calls.enqueue([s], now_ms=T0))
        prev = s.task_id
        ids.append(prev)
    q.scripts.streamed(calls)
    q.scripts.run(q.calls.cancel(root, now_ms=T0 + 1))
    pipe = q.redis.pipeline(transaction=False)
    for tid in ids:
        pipe.hget(q.keys.task(tid), "state")
    assert set(pipe.execute()) == {"canceled"}
    assert q.redis.zcard(q.keys.waiting) == 0


def test_progress_is_kept_as_decimal_text(queue: Queue) -> None:
    tid = enqueue(queue, T0, model="A")
    t = claim(queue, "w1", 75, now_ms=T0 + 1, loaded=[("A", 1)])
    assert t is not None

    def progress(fraction: str) -> str:
        queue.scripts.run(Call("progress", [tid, t["token"], fraction, "m"], lambda r: r))
        return queue.redis.hget(queue.keys.task(tid), "progress")

    assert progress("0.25") == "0.25"
    assert progress("0x0.8") == "0.5"  # Lua reads hex, Python's float() does not
    assert progress(" 1 ") == "1"
    assert queue.record(tid).progress == 1.0


def test_a_retry_starts_without_the_failed_run_s_progress(queue: Queue) -> None:
    """Found by a QA pass: a task's progress stayed at the failed run's 75% through its retry
    backoff and into the next run (which starts over, as its stream does), then jumped back."""
    tid = enqueue(queue, T0, model="A", max_attempts=2)
    t = claim(queue, "w1", 75, now_ms=T0 + 1, loaded=[("A", 1)])
    assert t is not None
    queue.scripts.run(Call("progress", [tid, t["token"], "0.75", "step 3"], lambda r: r))
    assert queue.progress(tid) == (0.75, "step 3")
    fail(queue, tid, t["token"], "boom", now_ms=T0 + 2)
    assert queue.record(tid).state.value == "delayed" and queue.progress(tid) is None


def test_a_canceled_hand_over_leaves_its_worker_s_wake_list(queue: Queue) -> None:
    register_worker(queue, "w1", idle=True, holds=("A",))
    queue.redis.hset(queue.keys.worker("w1"),
                     mapping={"handover_defer_ms": 100, "fair_every": 4, "lease_ms": 30_000})
    heartbeat(queue, "w1", [], now_ms=T0)
    tid = enqueue(queue, T0, model="A", vram_gb=10)
    assert queue.redis.zscore(queue.keys.handed, tid) is not None
    assert queue.redis.llen(queue.keys.wake("w1")) == 1
    queue.scripts.run(queue.calls.cancel(tid, now_ms=T0 + 10))
    assert queue.redis.lrange(queue.keys.wake("w1"), 0, -1) == []
    reap(queue, now_ms=T0 + 200)
    assert queue.redis.zscore(queue.keys.handed, tid) is None


def test_a_retired_worker_holds_nothing_and_leaves_nothing_for_good(queue: Queue) -> None:
    """Should it die between retire and its own leave, no reaper would ever see it."""
    register_worker(queue, "ret", idle=True, holds=("A",))
    register_worker(queue, "other", idle=True)
    queue.redis.hset(queue.keys.worker("ret"), "models", "A")
    heartbeat(queue, "ret", [], now_ms=T0)
    heartbeat(queue, "other", [], now_ms=T0)
    queue.redis.hset(queue.keys.settings, "min_workers", 0)
    assert queue.scripts.run(queue.calls.retire("ret", now_ms=T0 + 1))[0]
    assert queue.redis.smembers(queue.keys.holders("A")) == set()
    assert queue.redis.hget(queue.keys.lanes, "ret") is None
    assert 0 < queue.redis.pttl(queue.keys.worker("ret")) <= 86_400_000
    # a P2 task of its model is not held back for it as for a busy holder
    later = T0 + 3_600_000
    heartbeat(queue, "other", [], now_ms=later)
    tid = enqueue(queue, later, model="A", vram_gb=10, priority=2)
    t = claim(queue, "other", 75, now_ms=later + 3_000)
    assert t is not None and t["id"] == tid


def test_a_hand_over_to_a_worker_that_died_unread_gives_its_attempt_back(queue: Queue) -> None:
    """The reaper finds the worker dead before it looks at the hand-over's pickup deadline."""
    register_worker(queue, "w1", idle=True, holds=("A",))
    queue.redis.hset(queue.keys.worker("w1"),
                     mapping={"handover_defer_ms": 100, "fair_every": 4, "lease_ms": 30_000})
    heartbeat(queue, "w1", [], now_ms=T0)
    tid = enqueue(queue, T0, model="A", vram_gb=10, max_attempts=1)
    assert queue.redis.hmget(queue.keys.task(tid), "state", "worker") == ["running", "w1"]
    assert reap(queue, now_ms=T0 + 60_000).dead_workers == 1
    assert queue.redis.hmget(queue.keys.task(tid), "state", "attempt", "error") == [
        "queued", "0", "its worker died before picking it up"]
