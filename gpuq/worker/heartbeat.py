"""The heartbeat thread: renews the worker's liveness and its leases out of band, so a
handler stuck in a long GPU call never loses its lease, and tells handlers whose lease
was lost (or whose task was canceled) to stop. Between beats it blocks on the worker's
control list (gpuq.worker.control), waking early for yield deadlines."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING

import redis

from gpuq import backoff, worker_record
from gpuq.worker import presence
from gpuq.worker.control import Control
from gpuq.worker.gpu import nvml_used_gb

if TYPE_CHECKING:
    from gpuq.worker.loop import Worker

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    def __init__(self, worker: Worker) -> None:
        super().__init__(name=f"heartbeat-{worker.id}", daemon=True)
        self.worker = worker
        self.control = Control(worker)
        self.stopped = threading.Event()

    def beat(self) -> None:
        w = self.worker
        running = w.running_snapshot()
        used = nvml_used_gb(w.gpu.index) if w.gpu.source == "nvml" and w.gpu.index is not None else None
        state = "draining" if w.stopping.is_set() else ("busy" if running else "idle")
        call = w.calls.heartbeat(w.id, [(r.task_id, r.token) for r in running])
        with w.shown:  # a runner's newer view of the models must not be overwritten by this one
            with w.cache.lock:
                free = w.cache.free_gb()
                models = w.cache.model_names()
            fields: worker_record.Fields = {**w.static_fields,
                                       **worker_record.status_fields(free, len(running), models, state, used)}
            shown = ("HSET", w.keys.worker(w.id), *itertools.chain.from_iterable(fields.items()))
            replies = w.scripts.pipelined([call], [shown])
        revived, lost = call.parse(replies[0])
        if w.metrics is not None:
            w.metrics.gpu_state(w.gpu.total_gb, w.gpu.total_gb - free, used, len(running), len(models))
        if revived:
            self.restore_holdings()
        still = {r.task_id for r in w.running_snapshot()}  # a task acked since the snapshot is not lost
        for r in running:
            if r.task_id in lost and not r.ctx.lost and r.task_id in still:
                r.ctx.lost = True
                log.warning("lease.lost task=%s worker=%s", r.task_id, w.id)

    def restore_holdings(self) -> None:
        """The reaper took this worker for dead (a long pause) and dropped its holdings."""
        w = self.worker
        log.warning("worker.revived worker=%s: restoring model holdings", w.id)
        with w.cache.lock:  # no eviction can slip in between reading and writing them
            pipe = w.redis.pipeline(transaction=False)
            for model in w.cache.model_names():
                presence.hold(pipe, w.keys, w.id, model, True)
            pipe.execute()

    def run(self) -> None:
        w = self.worker
        next_beat = 0.0
        # retried at least once a heartbeat period: leases run out while Redis is away
        outage = w.outage
        retry = backoff.Backoff(cap=min(backoff.CAP_S, w.config.heartbeat_s))
        while not self.stopped.is_set():
            try:
                now = time.monotonic()
                if now >= next_beat and not w.retired:
                    self.beat()
                    outage.up(now)
                    retry.reset()
                    next_beat = now + w.config.heartbeat_s
                wait = min(next_beat - time.monotonic(), self.control.watch())
                message = w.redis.blpop([w.keys.control(w.id)], timeout=max(0.01, wait))
                if message is not None and not self.stopped.is_set():
                    self.control.handle(str(message[1]))
            except redis.RedisError as exc:  # down or restarting: said once, retried with backoff
                outage.down(exc)
                self.stopped.wait(retry.delay())
            except Exception:  # a bad control message must not end the heartbeat
                log.exception("heartbeat.error worker=%s", w.id)

    def stop(self) -> None:
        """Stop and join (before the worker leaves, so no beat re-registers it)."""
        self.stopped.set()
        try:
            self.worker.redis.lpush(self.worker.keys.control(self.worker.id), "wake")
        except redis.RedisError:
            pass
        if self.is_alive() and threading.current_thread() is not self:
            self.join(self.worker.config.heartbeat_s + 1)
