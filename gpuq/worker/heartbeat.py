"""The heartbeat thread: renews the worker's liveness and its leases out of band, so a
handler stuck in a long GPU call never loses its lease, and tells handlers whose lease
was lost (or whose task was canceled) to stop. After each beat it sends the run times the
worker measured (gpuq.worker.runtimes: learn.lua), and once more when it stops. Between
beats it blocks on the worker's control list (gpuq.worker.control), waking early for the next
deadline Control.watch keeps: a run's timeout (timeout_s), a yield's, a lost or stopped run's
grace."""

from __future__ import annotations

import logging
import threading
import time

import redis

from gpuq import backoff, catalog
from gpuq.backoff import Outage
from gpuq.errors import GpuqError
from gpuq.metrics import WorkerMetrics
from gpuq.scripts import Calls, Scripts
from gpuq.worker.broken import Broken
from gpuq.worker.control import Control
from gpuq.worker.gpu import GpuInfo, nvml_used_gb
from gpuq.worker.models import ModelCache
from gpuq.worker.presence import Presence
from gpuq.worker.running import RunningSet
from gpuq.worker.runtimes import RunTimes

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    def __init__(self, running: RunningSet, presence: Presence, cache: ModelCache,
                 scripts: Scripts, calls: Calls, control: Control, gpu: GpuInfo,
                 runtimes: RunTimes, *, period_s: float, outage: Outage, stopping: threading.Event,
                 retired: threading.Event, metrics: WorkerMetrics | None = None,
                 broken: Broken | None = None) -> None:
        super().__init__(name=f"heartbeat-{presence.worker_id}", daemon=True)
        self.id = presence.worker_id
        self.running = running
        self.presence = presence
        self.cache = cache
        self.scripts = scripts
        self.calls = calls
        self.control = control
        self.gpu = gpu
        self.runtimes = runtimes
        self.unsent = False  # the last learn call failed: said once until one succeeds
        self.period_s = period_s
        self.outage = outage  # Redis down: said once by all the worker's loops
        self.stopping = stopping  # shown as draining
        self.retired = retired  # left the pool: a beat would list it again
        self.metrics = metrics
        self.broken = broken  # the models its claims skip: its lane lists them when restored
        self.stopped = threading.Event()

    def beat(self) -> None:
        gpu = self.gpu
        running, settling = self.running.snapshot(), self.running.settling()
        used = nvml_used_gb(gpu.indices) if gpu.source == "nvml" and gpu.indices else None
        state = "draining" if self.stopping.is_set() else ("busy" if running else "idle")
        call = self.calls.heartbeat(self.id, [(r.task_id, r.token) for r in running] + settling)
        with self.presence.beat(self.cache, len(running), state,
                                None if used is None else sum(used)) as shown:
            replies = self.scripts.pipelined(
                [call], [shown.command, *catalog.renewals(self.presence.keys, shown.models)])
        revived, lost = call.parse(replies[0])
        if self.metrics is not None:
            self.metrics.gpu_state(gpu.total_gb, gpu.total_gb - shown.free_gb, used, len(running),
                                   len(shown.models))
        if revived:
            # the reaper took this worker for dead (a long pause) and dropped its holdings
            log.warning("worker.revived worker=%s: restoring model holdings", self.id)
            self.presence.restore(self.cache, self.broken.skipped() if self.broken else ())
        self.presence.resync(self.cache)  # holdings a load or eviction could not send
        for task_id, token in settling:  # ended: its answer no longer matters to its run
            if task_id in lost:
                self.running.settled(task_id, token)
        still = {r.task_id for r in self.running.snapshot()}  # a task acked since the snapshot is not lost
        for r in running:
            if r.task_id in lost and not r.ctx.lost and r.task_id in still:
                log.warning("lease.lost task=%s worker=%s", r.task_id, self.id)
                self.control.on_lost(r)

    def flush(self, rounds: int | None = 1) -> None:
        """Send measured run times to learn.lua (``RunTimes.send``); a failure is logged,
        not raised: the runs wait for the next beat (or are lost when refused)."""
        try:
            self.runtimes.send(self.scripts, self.calls, rounds=rounds)
            self.unsent = False
        except (redis.RedisError, GpuqError) as exc:
            log.log(logging.DEBUG if self.unsent else logging.WARNING,
                    "runtimes.unsent worker=%s waiting=%d error=%s", self.id, len(self.runtimes), exc)
            self.unsent = True
        dropped = self.runtimes.dropped()
        if dropped:
            # a worker running more tasks a beat than the buffer keeps learns from its newest
            # runs (the learned mean weighs the newest anyway): a warning only for runs lost
            # while the calls fail
            log.log(logging.WARNING if self.unsent else logging.DEBUG,
                    "runtimes.dropped worker=%s runs=%d: more waited than the buffer keeps",
                    self.id, dropped)

    def run(self) -> None:
        next_beat = 0.0
        # retried at least once a heartbeat period: leases run out while Redis is away
        retry = backoff.Backoff(cap=min(backoff.CAP_S, self.period_s))
        while not self.stopped.is_set():
            try:
                now = time.monotonic()
                if now >= next_beat and not self.retired.is_set():
                    self.beat()
                    self.outage.up(now)
                    retry.reset()
                    next_beat = now + self.period_s
                    self.flush()
                wait = min(next_beat - time.monotonic(), self.control.watch())
                message = self.control.receive(wait)
                if message is not None and not self.stopped.is_set():
                    self.control.handle(message)
            except redis.RedisError as exc:  # down or restarting: said once, retried with backoff
                self.outage.down(exc)
                self.stopped.wait(retry.delay())
            except Exception:  # a bad control message must not end the heartbeat
                log.exception("heartbeat.error worker=%s", self.id)

    def stop(self) -> None:
        """Stop and join (before the worker leaves, so no beat re-registers it), then send
        the run times still waiting (the runners have sent their last acks)."""
        self.stopped.set()
        try:
            self.control.wake()
        except redis.RedisError:
            pass
        if self.is_alive() and threading.current_thread() is not self:
            self.join(self.period_s + 1)
        self.flush(rounds=None)
