"""Contract: tasks no GPU class can hold leave their queues (park.lua), so they cannot keep
the tasks behind them from starting, and come back once a class holds them.

Every test runs on fakeredis and on the real server (the ``backend`` fixture).
"""

from __future__ import annotations

from helpers import T0, claim, enqueue, register_worker

from gpuq import Queue
from gpuq.reaper.loop import Reaper
from gpuq.task import State
from gpuq.views.inspect import pool_view


def park(queue: Queue, now_ms: int = T0, limit: int = 100) -> tuple[int, int]:
    """One pass at a virtual time: (parked, put back)."""
    return queue.scripts.run(queue.calls.park(limit=limit, now_ms=now_ms))


def queued(queue: Queue, model: str = "A", priority: int = 2) -> list[str]:
    return list(queue.redis.zrange(queue.keys.queue(priority, model), 0, -1))


def test_tasks_larger_than_every_class_no_longer_hold_their_queue(queue: Queue) -> None:
    """Eight tasks too large for any GPU at a queue's head fill the claim's scan (8): the
    small task behind them waits until the pass parks them, then starts."""
    register_worker(queue, "w1")  # A100, 75 GB usable
    big = [enqueue(queue, T0 + i, vram_gb=500) for i in range(8)]
    small = enqueue(queue, T0 + 10, vram_gb=1)
    assert claim(queue, "w1", 75, now_ms=T0 + 20) is None  # the scan sees only the big ones
    assert park(queue, T0 + 30) == (8, 0)
    assert queued(queue) == [small]
    assert queue.redis.zrange(queue.keys.need, 0, -1) == [small]
    assert set(queue.redis.zrange(queue.keys.parked, 0, -1)) == set(big)
    assert all(queue.record(t).state is State.QUEUED for t in big)
    view = pool_view(queue.redis, queue.keys)
    assert view.unschedulable == 8 and set(view.unschedulable_ids) == set(big)
    c = claim(queue, "w1", 75, now_ms=T0 + 40)
    assert c is not None and c["id"] == small
    assert park(queue, T0 + 50) == (0, 0)  # nothing more to move


def test_nothing_is_parked_before_any_class_is_known(queue: Queue) -> None:
    """Producers may enqueue before the first worker registers."""
    t = enqueue(queue, T0, vram_gb=500)
    assert park(queue) == (0, 0)
    assert queued(queue) == [t]


def test_a_task_that_fits_some_class_stays_queued(queue: Queue) -> None:
    register_worker(queue, "w1", "L4", 24)  # 19 GB usable
    register_worker(queue, "w2")  # 75 GB
    t = enqueue(queue, T0, vram_gb=70)
    assert park(queue) == (0, 0)
    assert queued(queue) == [t]


def test_parked_tasks_come_back_in_their_order_once_a_class_holds_them(queue: Queue) -> None:
    register_worker(queue, "w1")
    first = enqueue(queue, T0, vram_gb=500, priority="P1")
    second = enqueue(queue, T0 + 1, vram_gb=120, priority="P1")
    huge = enqueue(queue, T0 + 2, vram_gb=5000, priority="P1")
    assert park(queue, T0 + 10) == (3, 0)
    assert queue.redis.zscore(queue.keys.models_with_work, "1:A") is None  # no head left
    register_worker(queue, "big", "B1000", 1000)  # 995 GB usable
    assert park(queue, T0 + 20) == (0, 2)
    assert queued(queue, priority=1) == [first, second]
    assert queue.redis.zrange(queue.keys.parked, 0, -1) == [huge]
    assert queue.redis.hget(queue.keys.task(first), "parked") is None
    assert set(queue.redis.zrange(queue.keys.need, 0, -1)) == {first, second}
    c = claim(queue, "big", 995, now_ms=T0 + 30)
    assert c is not None and c["id"] == first


def test_a_multi_gpu_task_is_parked_until_a_group_holds_it(queue: Queue) -> None:
    """Its VRAM is its need over all its GPUs: a class of one 80 GB GPU cannot hold 150 GB
    over two; a class of two-GPU groups (150 GB usable) can."""
    register_worker(queue, "w1")
    t = enqueue(queue, T0, vram_gb=150, gpus=2)
    assert park(queue) == (1, 0)
    register_worker(queue, "g1", "H100", 80, gpus=2)
    assert park(queue) == (0, 1)
    assert queued(queue) == [t]


def test_cancel_and_expiry_take_a_parked_task_out_of_parked(queue: Queue) -> None:
    register_worker(queue, "w1")
    canceled = enqueue(queue, T0, vram_gb=500)
    late = enqueue(queue, T0, vram_gb=500, deadline_s=5, est_s=1)
    assert park(queue, T0 + 10) == (2, 0)
    queue.task(canceled).cancel()
    assert queue.record(canceled).state is State.CANCELED
    assert queue.redis.zrange(queue.keys.parked, 0, -1) == [late]
    assert queue.scripts.run(queue.calls.expire(now_ms=T0 + 10_000))[0] == 1
    assert queue.record(late).state is State.EXPIRED
    assert queue.redis.zcard(queue.keys.parked) == 0


def test_a_parked_task_whose_hash_was_corrupted_ends_failed(queue: Queue) -> None:
    register_worker(queue, "w1")
    t = enqueue(queue, T0, vram_gb=500)
    assert park(queue) == (1, 0)
    queue.redis.hdel(queue.keys.task(t), "priority")
    register_worker(queue, "big", "B1000", 1000)
    assert park(queue) == (0, 0)
    state, error = queue.redis.hmget(queue.keys.task(t), "state", "error")
    assert state == "failed" and "field priority" in error
    assert queue.redis.zcard(queue.keys.parked) == 0


def test_a_pass_is_bounded_and_the_reaper_pages_through(queue: Queue) -> None:
    register_worker(queue, "w1")
    queue.enqueue_many({"handler": "h", "model": "A", "vram_gb": 500} for _ in range(250))
    assert park(queue, limit=100) == (100, 0)
    assert Reaper(queue.redis, queue.config).park() == (150, 0)
    assert queue.redis.zcard(queue.keys.parked) == 250 and queued(queue) == []


def test_the_scale_signal_still_counts_parked_tasks_as_unschedulable(queue: Queue) -> None:
    """The autoscaler hears of a class larger than the pool's, parked or not."""
    register_worker(queue, "w1")
    enqueue(queue, T0, vram_gb=500)
    enqueue(queue, T0, vram_gb=300)
    assert park(queue) == (2, 0)
    enqueue(queue, T0 + 1, vram_gb=200)  # not yet parked
    plan = Reaper(queue.redis, queue.config).scaler.step()
    assert plan.unschedulable == 3 and plan.largest_need_gb == 500
