"""A client's view during the soak: the first outcome read of every acknowledged task.

About once a second it reads the state and result of each acknowledged task it has not yet
seen end, and keeps the first ending it reads (state and the run that wrote the result). The
checker compares it with the final record: an ending a client read that later changed is a
result written twice from that client's point of view, whatever Redis kept.

It also registers as a result waiter (wait.lua) for each acknowledged task at its first sweep,
so every end of the task pushes its done list: the checker's Redis witness counts them.
"""

from __future__ import annotations

import threading
import time

import redis

from gpuq.config import Config
from gpuq.keys import Keys
from gpuq.scripts import Calls, Scripts

from .checker import TERMINAL, run_of
from .producers import Ledger

CHUNK = 500


class Observer:
    def __init__(self, url: str, keys: Keys, ledger: Ledger) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5,
                                           socket_connect_timeout=1)
        self.keys = keys
        self.ledger = ledger
        self.seen: dict[str, tuple[str, str]] = {}  # task id -> (state, run) first read ended
        self.waiting: set[str] = set()  # registered as a waiter
        self.scripts = Scripts(self.client, keys)
        self.calls = Calls(Config(pool=keys.pool, prefix=keys.prefix))

    def run(self, stop: threading.Event, every_s: float = 1.0) -> None:
        while not stop.wait(every_s):
            try:
                self.sweep()
            except redis.RedisError:
                time.sleep(0.2)  # down or restarting: the next sweep reads again

    def sweep(self) -> None:
        with self.ledger.lock:
            pending = [t for t in self.ledger.acked if t not in self.seen]
        fresh = [t for t in pending if t not in self.waiting]
        for i in range(0, len(fresh), CHUNK):
            chunk = fresh[i:i + CHUNK]
            self.scripts.pipelined([self.calls.wait(task_id) for task_id in chunk])
            self.waiting.update(chunk)
        for i in range(0, len(pending), CHUNK):
            chunk = pending[i:i + CHUNK]
            pipe = self.client.pipeline(transaction=False)
            for task_id in chunk:
                pipe.hmget(self.keys.task(task_id), "state", "result")
            for task_id, (state, result) in zip(chunk, pipe.execute()):
                if state in TERMINAL:
                    self.seen[task_id] = (state, run_of(result))

    def close(self) -> None:
        self.client.close()
