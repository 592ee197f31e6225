"""Tasks stuck queued while an idle worker fits them, sampled during the soak.

Every couple of seconds it reads the head of every queue and the idle workers (in the pool's
idle set, running nothing, live, not SIGSTOPped by the injector), and notes each queued head
task that one of them fits (usable VRAM, priority served). A task noted at every sample for
``STUCK_S`` in a row is counted stuck, once: far longer than a claim takes (a worker blocked
for work looks again every second; a task is left for a better-placed worker for at most a
second or two). A sample that fails (Redis restarting) starts every task's count again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis

from gpuq.keys import Keys
from gpuq.worker_record import usable_gb
from workers.chaos import MODELS

STUCK_S = 10.0
HEAD = 8  # tasks looked at per (priority, model) queue


class StuckWatch:
    def __init__(self, url: str, keys: Keys, paused: Callable[[], set[str]]) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5,
                                           socket_connect_timeout=1)
        self.keys = keys
        self.paused = paused  # names of workers the injector has stopped now
        self.since: dict[str, float] = {}  # task -> first of an unbroken run of samples with a fit
        self.stuck: set[str] = set()

    def run(self, stop: threading.Event, every_s: float = 2.0) -> None:
        while not stop.wait(every_s):
            try:
                self.sample()
            except redis.RedisError:
                self.since.clear()

    def idle_usable(self) -> list[tuple[float, str]]:
        """(usable GB, levels) of each idle, live worker running nothing."""
        seconds, _micros = self.client.time()
        now_ms = int(seconds) * 1000
        names = [str(n) for n in self.client.zrange(self.keys.idle, 0, -1)]
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.hmget(self.keys.worker(name), "vram_total_gb", "kv_reserve_gb", "running", "levels")
            pipe.zscore(self.keys.workers, name)
        replies = pipe.execute()
        paused, out = self.paused(), []
        for i, name in enumerate(names):
            (total, reserve, running, levels), alive_until = replies[2 * i], replies[2 * i + 1]
            if total and running == "0" and alive_until and alive_until > now_ms and name not in paused:
                out.append((usable_gb(total, reserve), levels or "0123"))
        return out

    def sample(self) -> None:
        idle = self.idle_usable()
        pipe = self.client.pipeline(transaction=False)
        for p in range(4):
            for model in MODELS:
                pipe.zrange(self.keys.queue(p, model), 0, HEAD - 1)
        heads = [str(t) for ids in pipe.execute() for t in ids]
        pipe = self.client.pipeline(transaction=False)
        for task_id in heads:
            pipe.hmget(self.keys.task(task_id), "state", "vram_gb", "priority")
        now, fitting = time.monotonic(), set()
        for task_id, (state, need, level) in zip(heads, pipe.execute()):
            if state == "queued" and any(room >= float(need) and level in served for room, served in idle):
                fitting.add(task_id)
        self.since = {t: self.since.get(t, now) for t in fitting}
        self.stuck |= {t for t, at in self.since.items() if now - at >= STUCK_S}

    def close(self) -> None:
        self.client.close()
