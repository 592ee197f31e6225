"""The heartbeat thread: renews the worker's liveness and its leases out of band, so a
handler stuck in a long GPU call never loses its lease, and tells handlers whose lease
was lost (or whose task was canceled) to stop."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import redis

from gpuq.worker import presence
from gpuq.worker.gpu import nvml_used_gb

if TYPE_CHECKING:
    from gpuq.worker.loop import Worker

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    def __init__(self, worker: Worker) -> None:
        super().__init__(name=f"heartbeat-{worker.id}", daemon=True)
        self.worker = worker
        self.stopped = threading.Event()

    def beat(self) -> None:
        w = self.worker
        running = w.running_snapshot()
        with w.cache.lock:
            free = w.cache.free_gb()
            models = w.cache.model_names()
        state = "draining" if w.stopping.is_set() else ("busy" if running else "idle")
        used = nvml_used_gb(w.gpu.index) if w.gpu.source == "nvml" and w.gpu.index is not None else None
        pipe = w.redis.pipeline(transaction=False)
        w.scripts.queue(pipe, w.calls.heartbeat(w.id, [(r.task_id, r.token) for r in running]))
        fields: presence.Fields = {**w.static_fields,
                                   **presence.status_fields(free, len(running), models, state, used)}
        pipe.hset(w.keys.worker(w.id), mapping=fields)
        for model in models:  # restores holdings if the reaper wrongly took this worker for dead
            presence.hold(pipe, w.keys, w.id, model, True)
        reply = pipe.execute()[0]
        lost = set(w.calls.heartbeat(w.id, []).parse(reply))
        for r in running:
            if r.task_id in lost and not r.ctx.lost.is_set():
                r.ctx.lost.set()
                log.warning("lease.lost task=%s worker=%s", r.task_id, w.id)

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.beat()
            except redis.RedisError as exc:
                log.error("heartbeat.failed worker=%s error=%s", self.worker.id, exc)
            self.stopped.wait(self.worker.config.heartbeat_s)

    def stop(self) -> None:
        self.stopped.set()
