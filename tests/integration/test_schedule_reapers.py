"""Periodic tasks and delayed tasks through real reapers on the real server's clock.

Two reapers firing the same schedule at once enqueue one run per period; a reaper back
after missed periods enqueues one run; the active reaper promotes a delayed task at its due
time rather than at its next round.
"""

from __future__ import annotations

import threading
import time

from gpuq import Queue
from gpuq import schedule as sched
from gpuq.clock import server_ms
from gpuq.config import Config
from gpuq.reaper.loop import Reaper


def reaper(q: Queue) -> Reaper:
    return Reaper(q.redis, Config(pool=q.keys.pool, prefix=q.keys.prefix, reap_interval_s=5.0))


def runs(q: Queue, name: str) -> list[int]:
    keys = q.redis.scan_iter(match=q.keys.task(f"{name}@*"))
    return sorted(int(k.rsplit("@", 1)[1]) for k in keys)


def test_two_reapers_firing_at_once_enqueue_one_run_per_period(real_queue: Queue) -> None:
    s = sched.add(real_queue.redis, real_queue.keys, "tick", "h", model="A", vram_gb=1, every="1s")
    reapers, stop = [reaper(real_queue), reaper(real_queue)], time.monotonic() + 3.5

    def spin(r: Reaper) -> None:
        while time.monotonic() < stop:
            r.fire_schedules()

    threads = [threading.Thread(target=spin, args=(r,)) for r in reapers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    periods = (server_ms(real_queue.redis) - s.anchor_ms) // 1000
    assert runs(real_queue, "tick") == [s.anchor_ms + 1000 * k for k in range(1, periods + 1)]


def test_a_reaper_back_after_missed_periods_enqueues_one_run(real_queue: Queue) -> None:
    s = sched.add(real_queue.redis, real_queue.keys, "tick", "h", model="A", vram_gb=1, every="1s")
    text = real_queue.redis.hget(real_queue.keys.schedules, "tick")
    # as if it was added 10.5 s ago and no reaper ran since
    real_queue.redis.hset(real_queue.keys.schedules, "tick",
                          text.replace(str(s.anchor_ms), str(s.anchor_ms - 10_500)))
    r = reaper(real_queue)
    assert r.lead()
    first = r.round().scheduled
    again = r.round().scheduled
    assert first == 1 and again == 0
    assert len(runs(real_queue, "tick")) == 1


def test_a_skip_missed_schedule_back_late_enqueues_nothing(real_queue: Queue) -> None:
    s = sched.add(real_queue.redis, real_queue.keys, "tick", "h", model="A", vram_gb=1, every="5m",
                  skip_missed=True)
    text = real_queue.redis.hget(real_queue.keys.schedules, "tick")
    real_queue.redis.hset(real_queue.keys.schedules, "tick",
                          text.replace(str(s.anchor_ms), str(s.anchor_ms - 390_000)))
    # its one period due passed 90 s ago, more than the grace: skipped, and recorded
    assert reaper(real_queue).fire_schedules() == 0 and runs(real_queue, "tick") == []
    (only,) = sched.list_schedules(real_queue.redis, real_queue.keys)
    assert only.last_ms == s.anchor_ms - 90_000


def test_the_active_reaper_wakes_at_a_due_time_before_its_next_round(real_queue: Queue) -> None:
    r = reaper(real_queue)
    assert r.lead()
    task = real_queue.enqueue("h", model="A", vram_gb=1, priority="P0", delay_s=0.3)
    next_round = time.monotonic() + 5.0
    due = r.next_due(next_round)
    assert time.monotonic() < due < time.monotonic() + 0.35
    r.stopped.clear()
    runner = threading.Thread(target=r.run)
    runner.start()
    try:
        deadline = time.monotonic() + 2.0
        while task.status().value != "queued" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert task.status().value == "queued"
    finally:
        r.stopped.set()
        real_queue.redis.lpush(real_queue.keys.urgent, "1")  # unblock its wait for the next round
        runner.join(5)
