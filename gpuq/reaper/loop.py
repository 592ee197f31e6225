"""The reaper loop: hold the pool's lock, then recover dead workers' tasks and due retries.

Every instance runs this loop; only the lock holder acts. The lock expires after
``reaper_lock_s`` unless renewed, so a standby takes over within that time when the active
reaper dies. Recovery itself is one bounded script call per round (reap.lua).
"""

from __future__ import annotations

import logging
import signal
import threading
import uuid

import redis

from gpuq.client import redis_errors
from gpuq.config import Config
from gpuq.keys import Keys
from gpuq.scripts import Calls, ReapResult, Scripts

log = logging.getLogger(__name__)


class Reaper:
    def __init__(self, client: redis.Redis, config: Config) -> None:
        self.redis = client
        self.config = config
        self.keys = Keys(config.pool, config.prefix)
        self.scripts = Scripts(client, self.keys)
        self.calls = Calls(config)
        self.token = uuid.uuid4().hex
        self.active = False
        self.stopped = threading.Event()

    def lead(self) -> bool:
        active = self.scripts.run(self.calls.lead(self.token))
        if active != self.active:
            log.info("reaper.%s pool=%s token=%s", "active" if active else "standby",
                     self.config.pool, self.token[:8])
        self.active = active
        return active

    def reap_once(self) -> ReapResult:
        """One full recovery pass (repeats the bounded script until nothing is left)."""
        total = ReapResult(0, 0, 0, 0)
        while True:
            r = self.scripts.run(self.calls.reap(limit=100))
            total = total + r
            if r.requeued + r.failed + r.promoted < 100 and r.dead_workers < 100:
                break
        if total.requeued or total.failed or total.dead_workers:
            log.warning("reaper.recovered pool=%s requeued=%d failed=%d dead_workers=%d",
                        self.config.pool, total.requeued, total.failed, total.dead_workers)
        return total

    def run(self, once: bool = False) -> int:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stopped.set())
            signal.signal(signal.SIGINT, lambda *_: self.stopped.set())
        with redis_errors(self.config.redis_url):
            if once:
                self.reap_once()
                return 0
            while not self.stopped.is_set():
                try:
                    if self.lead():
                        self.reap_once()
                except redis.RedisError as exc:
                    log.error("reaper.redis_error pool=%s error=%s", self.config.pool, exc)
                self.stopped.wait(self.config.reap_interval_s)
            self.scripts.run(self.calls.lead(self.token, release=True))
        return 0
