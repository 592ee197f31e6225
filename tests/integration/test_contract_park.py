"""Contract: tasks no live worker can hold leave their queues (park.lua), so they cannot keep
the tasks behind them from starting, and come back once a live worker can hold them.

Every test runs on fakeredis and on the real server (the ``backend`` fixture).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from helpers import T0, claim, enqueue, register_worker

from gpuq import Queue, shapes
from gpuq.reaper.loop import Reaper
from gpuq.task import State
from gpuq.views.inspect import pool_view

A100 = [(75.0, 1)]  # one live 80 GB GPU: 75 GB usable


def park(queue: Queue, live: Sequence[tuple[float, int]] = tuple(A100), now_ms: int = T0,
         limit: int = 100) -> tuple[int, int]:
    """One call at a virtual time against these live workers' shapes: (parked, put back)."""
    parked, put_back, _ = queue.scripts.run(queue.calls.park(live, limit=limit, now_ms=now_ms))
    return parked, put_back


def queued(queue: Queue, model: str = "A", priority: int = 2) -> list[str]:
    return list(queue.redis.zrange(queue.keys.queue(priority, model), 0, -1))


def test_tasks_larger_than_every_live_gpu_no_longer_hold_their_queue(queue: Queue) -> None:
    """Eight tasks too large for any GPU at a queue's head fill the claim's scan (8): the
    small task behind them waits until the pass parks them, then starts."""
    register_worker(queue, "w1")  # A100, 75 GB usable
    big = [enqueue(queue, T0 + i, vram_gb=500) for i in range(8)]
    small = enqueue(queue, T0 + 10, vram_gb=1)
    assert claim(queue, "w1", 75, now_ms=T0 + 20) is None  # the scan sees only the big ones
    assert park(queue, now_ms=T0 + 30) == (8, 0)
    assert queued(queue) == [small]
    assert queue.redis.zrange(queue.keys.need, 0, -1) == [small]
    assert set(queue.redis.zrange(queue.keys.parked, 0, -1)) == set(big)
    assert all(queue.record(t).state is State.QUEUED for t in big)
    view = pool_view(queue.redis, queue.keys)
    assert (view.parked, view.unschedulable) == (8, 8) and set(view.unschedulable_ids) == set(big)
    c = claim(queue, "w1", 75, now_ms=T0 + 40)
    assert c is not None and c["id"] == small
    assert park(queue, now_ms=T0 + 50) == (0, 0)  # nothing more to move


def test_nothing_is_parked_while_no_worker_is_live(queue: Queue) -> None:
    """Producers may enqueue before the first worker registers."""
    t = enqueue(queue, T0, vram_gb=500)
    assert park(queue, []) == (0, 0)
    assert queued(queue) == [t]


def test_a_task_that_fits_some_live_worker_stays_queued(queue: Queue) -> None:
    t = enqueue(queue, T0, vram_gb=70)
    assert park(queue, [(19.0, 1), (75.0, 1)]) == (0, 0)
    assert queued(queue) == [t]


def test_parked_tasks_come_back_in_their_order_once_a_live_worker_holds_them(queue: Queue) -> None:
    first = enqueue(queue, T0, vram_gb=500, priority="P1")
    second = enqueue(queue, T0 + 1, vram_gb=120, priority="P1")
    huge = enqueue(queue, T0 + 2, vram_gb=5000, priority="P1")
    assert park(queue, now_ms=T0 + 10) == (3, 0)
    assert queue.redis.zscore(queue.keys.models_with_work, "1:A") is None  # no head left
    assert park(queue, [*A100, (995.0, 1)], now_ms=T0 + 20) == (0, 2)
    assert queued(queue, priority=1) == [first, second]
    assert queue.redis.zrange(queue.keys.parked, 0, -1) == [huge]
    assert queue.redis.hget(queue.keys.task(first), "parked") is None
    assert set(queue.redis.zrange(queue.keys.need, 0, -1)) == {first, second}
    c = claim(queue, "big", 995, now_ms=T0 + 30)
    assert c is not None and c["id"] == first


def test_a_multi_gpu_task_is_parked_until_a_live_group_holds_it(queue: Queue) -> None:
    """Its VRAM is its need over all its GPUs: one 80 GB GPU cannot hold 150 GB over two; a
    group of two (150 GB usable) can."""
    t = enqueue(queue, T0, vram_gb=150, gpus=2)
    assert park(queue) == (1, 0)
    assert park(queue, [(300.0, 1)]) == (0, 0)  # room enough, one GPU
    assert park(queue, [*A100, (150.0, 2)]) == (0, 1)
    assert queued(queue) == [t]


def test_parked_tasks_no_live_group_holds_do_not_hide_those_behind_them(queue: Queue) -> None:
    """Regression: the put-back read the same first page of `parked` every call, so tasks
    asking more GPUs than any live group has, parked first, kept a task a live worker could
    hold parked for ever. The put-back reads only the scores some live shape holds (`need`
    scores a task by its VRAM and GPUs), so it never meets them."""
    wide = [enqueue(queue, T0 + i, vram_gb=100, gpus=2) for i in range(3)]
    one = enqueue(queue, T0 + 5, vram_gb=150)
    assert park(queue) == (4, 0)
    live = [*A100, (200.0, 1)]  # room for all, but no group of two
    assert queue.scripts.run(queue.calls.park(live, limit=2, now_ms=T0)) == (0, 1, 1)
    assert queued(queue) == [one]
    assert set(queue.redis.zrange(queue.keys.parked, 0, -1)) == set(wide)
    assert queue.scripts.run(queue.calls.park(live, limit=2, now_ms=T0)) == (0, 0, 0)


def test_a_task_asking_more_gpus_than_any_live_group_is_parked_though_one_gpu_has_room(
        queue: Queue) -> None:
    """The defect: parking weighed VRAM only, so 60 GB over two GPUs stayed queued beside
    live one-GPU 80 GB workers, and eight of them at its queue's head held the queue."""
    register_worker(queue, "w1")  # A100, 75 GB usable
    wide = [enqueue(queue, T0 + i, vram_gb=60, gpus=2) for i in range(8)]
    small = enqueue(queue, T0 + 10, vram_gb=1)
    assert claim(queue, "w1", 75, now_ms=T0 + 20) is None  # the scan sees only the wide ones
    assert park(queue, now_ms=T0 + 30) == (8, 0)
    assert queued(queue) == [small] and queue.redis.zrange(queue.keys.need, 0, -1) == [small]
    c = claim(queue, "w1", 75, now_ms=T0 + 40)
    assert c is not None and c["id"] == small
    assert park(queue, [*A100, (150.0, 4)], now_ms=T0 + 50) == (0, 8)  # a group of four holds them
    assert queued(queue) == wide


def test_a_group_holds_a_task_only_within_its_own_vram(queue: Queue) -> None:
    """A group of two 40 GB cards (76 GB usable) beside an 80 GB card: 78 GB over two GPUs
    fits neither; 70 GB over two fits the group, 70 GB on one the card."""
    live = [*A100, (76.0, 2)]
    over = enqueue(queue, T0, vram_gb=78, gpus=2)
    fits = [enqueue(queue, T0 + 1, vram_gb=70, gpus=2), enqueue(queue, T0 + 2, vram_gb=70)]
    assert park(queue, live) == (1, 0)
    assert queued(queue) == fits
    assert queue.redis.zrange(queue.keys.parked, 0, -1) == [over]
    assert park(queue, [(76.0, 2), (78.0, 3)]) == (0, 1)  # a group of three holds it
    assert over in queued(queue)


def test_the_reaper_weighs_live_workers_not_every_class_ever_seen(queue: Queue) -> None:
    """Regression: a class stays in `classes` after its last worker leaves; tasks only it
    held were not parked and held their queue again. The reaper parks by the live workers
    its scale step read, and pages through the parked tasks round after round."""
    register_worker(queue, "w1")
    register_worker(queue, "w2", "B600", 600)  # 595 GB usable
    reaper = Reaper(queue.redis, queue.config)
    assert reaper.park() == (0, 0)  # no scale step yet: nothing known of the live workers
    big = enqueue(queue, vram_gb=500)
    reaper.scaler.step()
    assert reaper.park() == (0, 0)  # w2 holds it
    queue.redis.zrem(queue.keys.workers, "w2")  # w2 left
    reaper.scaler.step()
    assert reaper.park() == (1, 0)
    assert queue.redis.zrange(queue.keys.parked, 0, -1) == [big]
    assert pool_view(queue.redis, queue.keys).unschedulable == 0  # a class holds it: it waits


def test_cancel_and_expiry_take_a_parked_task_out_of_parked(queue: Queue) -> None:
    canceled = enqueue(queue, T0, vram_gb=500)
    late = enqueue(queue, T0, vram_gb=500, deadline_s=5, est_s=1)
    assert park(queue, now_ms=T0 + 10) == (2, 0)
    queue.task(canceled).cancel()
    assert queue.record(canceled).state is State.CANCELED
    assert queue.redis.hget(queue.keys.task(canceled), "parked") is None
    assert queue.redis.zrange(queue.keys.parked, 0, -1) == [late]
    assert queue.scripts.run(queue.calls.expire(now_ms=T0 + 10_000))[0] == 1
    assert queue.record(late).state is State.EXPIRED
    assert queue.redis.hget(queue.keys.task(late), "parked") is None
    assert queue.redis.zcard(queue.keys.parked) == 0


def test_a_parked_task_whose_hash_was_corrupted_ends_failed(queue: Queue) -> None:
    t = enqueue(queue, T0, vram_gb=500)
    assert park(queue) == (1, 0)
    queue.redis.hdel(queue.keys.task(t), "priority")
    assert park(queue, [(995.0, 1)]) == (0, 0)
    state, error = queue.redis.hmget(queue.keys.task(t), "state", "error")
    assert state == "failed" and "field priority" in error
    assert queue.redis.zcard(queue.keys.parked) == 0


def test_a_call_is_bounded_and_the_reaper_pages_through(queue: Queue) -> None:
    register_worker(queue, "w1")
    queue.enqueue_many({"handler": "h", "model": "A", "vram_gb": 500} for _ in range(250))
    assert park(queue, limit=100) == (100, 0)
    reaper = Reaper(queue.redis, queue.config)
    reaper.scaler.step()
    assert reaper.park() == (150, 0)
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


def test_a_damaged_worker_hash_does_not_turn_parking_off(queue: Queue) -> None:
    """Regression: one live worker whose hash reads as a size below its reserve (written by
    hand, or by an old release) made every park call INVALID, round after round."""
    register_worker(queue, "w1")
    register_worker(queue, "odd")
    queue.redis.hset(queue.keys.worker("odd"), mapping={"vram_total_gb": 3, "kv_reserve_gb": 5})
    big = enqueue(queue, vram_gb=500)
    reaper = Reaper(queue.redis, queue.config)
    reaper.scaler.step()
    assert reaper.park() == (1, 0)
    assert queue.redis.zrange(queue.keys.parked, 0, -1) == [big]


def test_parked_is_exactly_what_no_live_shape_holds(queue: Queue) -> None:
    """Against shapes drawn at random (a fixed seed), one call leaves parked exactly the
    tasks that gpuq.shapes.holds says no live shape holds, boundaries included, and puts
    back the rest: the score ranges of lua/lib/classes.lua agree with the Python rule. (A
    task over g GPUs less than a score's VRAM step, 2**-52 of g x 2**40, above a shape's
    usable VRAM reads as held and stays queued; none is parked that a shape holds.)"""
    rng = random.Random(7)
    sizes, counts = [19.0, 75.0, 75.3, 76.0, 150.0, 300.0], [1, 2, 4, 8, 64]
    needs = [*sizes, 0.5, 74.99, 75.29, 75.31, 500.0]
    tasks = {enqueue(queue, T0 + i, vram_gb=v, gpus=g): (v, g)
             for i, (v, g) in enumerate((v, g) for v in needs for g in counts)}
    for _ in range(25):
        live = [(rng.choice(sizes), rng.choice(counts)) for _ in range(rng.randint(1, 3))]
        park(queue, live)
        unheld = {t for t, (v, g) in tasks.items() if not shapes.holds(live, v, g)}
        assert set(queue.redis.zrange(queue.keys.parked, 0, -1)) == unheld, live
        assert len(queue.redis.zrange(queue.keys.need, 0, -1)) == len(tasks) - len(unheld)


def test_a_parked_task_scored_as_one_gpu_is_rescored_not_read_again(queue: Queue) -> None:
    """A task over two GPUs parked with its VRAM alone as score (as parking scored before it
    weighed GPUs) lies where one-GPU tasks a live worker holds lie: the put-back reads it,
    leaves it parked and scores it by its shape, so no later call reads it again."""
    t = enqueue(queue, T0, vram_gb=60, gpus=2)
    assert park(queue) == (1, 0)
    shaped = queue.redis.zscore(queue.keys.parked, t)
    queue.redis.zadd(queue.keys.parked, {t: 60})
    assert queue.scripts.run(queue.calls.park(A100, now_ms=T0)) == (0, 0, 0)  # read, stays
    assert queue.redis.zscore(queue.keys.parked, t) == shaped == shapes.score(60, 2)
    assert queue.redis.zrangebyscore(queue.keys.parked, "-inf", 75) == []  # not read again


def test_tasks_left_at_a_held_ranges_end_do_not_keep_the_next_ranges_unread(queue: Queue) -> None:
    """Found by a QA pass: a held range of a wide shape reads a score step past its end, and
    tasks there that no live shape holds stay parked; 100 of them used the call's whole read
    budget, so a task over four GPUs a new group held never went back. Each range has its own."""
    over = 150 + 2**-11  # within the step past (150 GB, 2 GPUs): its score rounds nowhere
    [enqueue(queue, T0 + i, vram_gb=over, gpus=2) for i in range(100)]
    four = enqueue(queue, T0 + 200, vram_gb=100, gpus=4)
    assert park(queue, [(150.0, 2)]) == (100, 0) and park(queue, [(150.0, 2)]) == (1, 0)
    assert queue.scripts.run(queue.calls.park([(150.0, 2), (120.0, 4)], now_ms=T0)) == (0, 1, 1)
    assert queued(queue) == [four] and queue.redis.zcard(queue.keys.parked) == 100


def test_a_corrupt_task_in_need_is_failed_not_read_again(queue: Queue) -> None:
    """Found by a QA pass: the parking half passed over a `need` entry whose hash was corrupt
    and read it again every call, so with limit 1 the task behind it was never parked."""
    bad = enqueue(queue, T0, vram_gb=100, gpus=2)
    good = enqueue(queue, T0 + 1, vram_gb=100, gpus=2)
    queue.redis.hdel(queue.keys.task(bad), "priority")
    park(queue, limit=1)
    state, error = queue.redis.hmget(queue.keys.task(bad), "state", "error")
    assert state == "failed" and "priority" in error
    assert queue.redis.zscore(queue.keys.need, bad) is None
    assert park(queue, limit=1) == (1, 0) and queue.redis.zscore(queue.keys.parked, good) is not None
