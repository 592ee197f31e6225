"""The worker: one process per GPU, ``concurrency`` runner threads that claim and run tasks.

Each runner claims under the model cache's lock (so the VRAM it reports is what it holds),
runs the task (with the batch it starts, for a batch handler: ``gpuq.worker.batch``) in its
own thread and loops; with nothing to claim it blocks on its wake lists, never a sleep loop.
SIGTERM stops claiming, lets running tasks finish for ``shutdown_grace_s``, requeues what is
still running (attempt given back), and exits; a second signal ends the grace; ``gpuq drain``
waits without a limit. Idle for ``idle_timeout_s``, while the pool keeps more than
``min_workers`` live, it unloads its models (a hung unloader does not hold the exit:
ModelCache.unload_all), leaves and exits 0 (no autoscaler kills a busy worker); both ways
out are gpuq.worker.leaving's.

An ``async def`` handler runs on the worker's one event loop while its runner thread waits
(gpuq.worker.eventloop), so N runners give N concurrent coroutines sharing one model.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from typing import Any

import redis

from gpuq import recovery, worker_record
from gpuq.app import App
from gpuq.backoff import Backoff, Outage
from gpuq.config import Config
from gpuq.connection import redis_errors
from gpuq.errors import StaleLease
from gpuq.failover import follow_master
from gpuq.keys import Keys
from gpuq.metrics import WorkerMetrics
from gpuq.metrics_http import serve_http
from gpuq.scripts import Call, Calls, Scripts
from gpuq.worker import batch, leaving, passing
from gpuq.worker.asking import Asking
from gpuq.worker.batch import Added
from gpuq.worker.control import Control
from gpuq.worker.executor import Claimed, Executor
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.heartbeat import Heartbeat
from gpuq.worker.models import ModelCache
from gpuq.worker.observer import Observer
from gpuq.worker.presence import Presence
from gpuq.worker.running import SHUT_DOWN, RunningSet
from gpuq.worker.runtimes import RunTimes
from gpuq.worker.takeup import handed_over, pop, start_by

log = logging.getLogger(__name__)


class Worker:
    def __init__(self, client: redis.Redis, config: Config, app: App, gpu: GpuInfo, *,
                 worker_id: str | None = None, burst: bool = False, levels: str | None = None) -> None:
        self.redis = client
        self.config = config
        self.app = app
        self.gpu = gpu
        self.burst = burst
        self.unparked = False  # a burst worker put back the parked tasks it can hold (once)
        self.levels = levels or config.levels()
        self.batches = batch.wanted(app)
        gpu_tag = gpu.index_text.replace(",", "+") or "x"
        self.id = worker_id or f"{socket.gethostname()}-{gpu_tag}-{uuid.uuid4().hex[:6]}"
        self.keys = Keys(config.pool, config.prefix)
        self.scripts = Scripts(client, self.keys)
        self.calls = Calls(config)
        self.cache = ModelCache(app, gpu.total_gb, gpu.reserve_gb(config.kv_reserve_gb))
        self.stopping = threading.Event()
        self.done = threading.Event()
        self.draining = False  # drain: finish running tasks however long they take
        self.hurry = threading.Event()  # a second SIGTERM/SIGINT: give running tasks back now
        self.stop_lock = threading.RLock()  # RLock: a signal may land while main holds it
        self.retired = threading.Event()  # left the pool after its idle timeout
        self.running = RunningSet()
        self.presence = Presence(client, self.keys, self.id)
        self.observer = Observer()  # metrics opt-in: --metrics-port
        self.runtimes = RunTimes()  # the executor adds acked runs, the heartbeat sends them
        self.executor = Executor(app, self.cache, self.presence, self.running, self.scripts,
                                 self.calls, self.observer, self.runtimes, gpu.count)
        self.asking = Asking(self.id, self.levels, gpu.count, self.batches, self.cache, self.executor.broken,
                             self.calls)
        self.outage = Outage(f"worker={self.id}", log)  # Redis down: said once by all its loops
        self.blocked = 0  # runners blocked on the wake lists (concurrency > 1: see wake_sibling)
        self._blocked_lock = threading.Lock()

    def settle(self, pending: list[Call[Any]]) -> None:
        """Send the finished tasks' acks or fails alone, in one round trip."""
        if pending:
            batch.settle_all(self.executor, pending, self.executor.send(pending))

    def claim(self, pending: list[Call[Any]] | None = None, lookout: bool = False,
              unlisted: bool = False) -> tuple[Claimed, Added | None] | float:
        """Send the previous task's (or batch's) acks or fails and claim the next task (with
        the tasks taken beside a batch handler's), in one round trip. Claims hold the cache
        lock so the VRAM reported is what is free. With nothing to claim, returns when to
        look again (0: when woken). lookout: the runner's last claim replied a retry;
        unlisted: this one-slot worker is not in `idle` (ClaimRequest)."""
        pending = pending or []
        with self.cache.lock:
            slots = self.config.concurrency - self.running.slots_used()
            if slots <= 0 or self.stopping.is_set():  # stopping: retired or draining, claim none
                self.settle(pending)
                return 0.0
            call = self.asking.call(slots, lookout, unlisted)
            *done, reply = self.scripts.pipelined([*pending, call])
            batch.settle_all(self.executor, pending, done)
            claim = call.parse(reply)
            if claim.task is None:
                return claim.retry_s
            first = (claim.task, *self.executor.begin(claim.task))
            return first, batch.begin_added(self.executor, claim.batch)

    def handed(self, fields: dict[str, str], start_by: float | None = None) -> Claimed | None:
        """A task enqueue started on this worker (handed_over), popped off its wake list: it
        runs once taken up (docs/PROTOCOL.md, Hand-over; Executor.take_up), unless the
        worker is stopping (then it goes back to its queue). ``start_by``: until when its
        handler may start warm before began is answered (takeup.start_by)."""
        with self.cache.lock:
            claimed = None if self.stopping.is_set() else (fields, *self.executor.begin(fields))
        if claimed is None:
            self.give_back(fields["id"], int(fields["token"]))
            return None
        claimed[2].start_by = start_by
        return claimed if self.executor.take_up(*claimed) else None

    def give_back(self, task_id: str, token: int, until: float = 0.0, checkpoint: str = "") -> None:
        """Requeue a task this worker was given but will not finish (its attempt given back,
        the checkpoint its handler saved kept). Redis away: tried again with backoff until
        ``until`` (monotonic), since the reaper would recover it as a dead worker's."""
        backoff = Backoff()
        while True:
            try:
                self.scripts.run(self.calls.requeue(task_id, token, SHUT_DOWN,
                                                    checkpoint=checkpoint))
                log.warning("task.requeued task=%s worker=%s reason=shutdown", task_id, self.id)
                return
            except StaleLease:
                return
            except redis.RedisError as exc:
                if not backoff.pause_until(until):
                    log.error("task.requeue_failed task=%s error=%s (the reaper will recover it)",
                              task_id, exc)
                    return

    def wait_for_work(self, retry_s: float) -> Claimed | bool | None:
        """Block on this worker's wake list and the pool's (no sleep loop). A task left for a
        better-placed worker is looked at again once its deferral ends (retry_s), a skipped
        model's once its backoff ends (gpuq.worker.broken). Returns a task handed over at
        enqueue, if the wake-up carried one; True for a "look" token (lib/lookout.lua)."""
        if self.burst:
            if not self.running.wait(retry_s or 1.0, unless_empty=retry_s <= 0):
                if not self.unparked and leaving.put_back_parked(self):  # once: then claim again
                    self.unparked = True
                    return None
                self.stopping.set()  # burst: nothing left that this worker can run
                self.done.set()
        elif self.running.slots_used() < self.config.concurrency:
            # at most idle_block_s: the client's read timeout counts on it (gpuq.cli.open_queue)
            timeout = max(0.01, min(retry_s if retry_s > 0 else self.config.idle_block_s,
                                    self.config.idle_block_s, self.executor.broken.ends_in() + 0.01))
            with self._blocked_lock:
                self.blocked += 1
            try:
                popped, clock = pop(self.redis, [self.keys.wake(self.id), self.keys.pool_wake], timeout)
            finally:
                with self._blocked_lock:
                    self.blocked -= 1
            if popped is not None and popped[1] == "look":
                return True
            fields = handed_over(popped[1]) if popped is not None else None
            if fields is not None:
                return self.handed(fields, start_by(fields, *clock))
        else:
            self.running.wait(1.0)
        return None

    def wake_sibling(self) -> None:
        """A claim found work while other runners of this worker are blocked on the wake
        lists: wake one, so it claims too (and wakes the next if it finds work). Enqueue
        wakes a worker once (and at most 16 through the pool's list), so without this the
        runners of a worker with many slots would pick up a burst one idle timeout apart.
        A failure is passed over: the task just claimed must run (the sibling looks again
        at its idle timeout)."""
        try:
            self.redis.lpush(self.keys.wake(self.id), "1")
        except redis.RedisError as exc:
            log.debug("worker.wake_sibling_failed worker=%s error=%s", self.id, exc)

    def runner(self) -> None:
        pending: list[Call[Any]] = []  # the finished task's (or batch's) acks or fails, not yet sent
        waited = False  # the last claim found nothing and the runner waited for work
        from_idle = False  # the task just run was claimed right after such a wait
        online = False  # the task (or batch) just run was P0/P1
        lookout = False  # the last claim said when to look again: this runner is a lookout
        # a one-slot worker given a task (by its claim or a hand-over) is not in `idle`: only
        # its own claim that finds nothing lists it, so the next claim need not unlist it
        unlisted, one_slot = False, self.config.concurrency == 1
        outage, backoff = self.outage, Backoff()
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                if pending and (from_idle or (online and self.batches) or passing.passed(pending)):
                    # a task taken by a worker that was idle: someone may be waiting on it,
                    # and a claim sent with its ack would hold the waiter's reply back by
                    # its own server time; in a busy streak the ack rides with the claim,
                    # unless the task was online work and the claim may take a whole batch
                    # (30 tasks' starts, 0.6 ms of server time), or was passed on (passing.py)
                    self.settle(pending)
                    pending = passing.sit_out(pending, self.stopping)
                unlisted, was = False, unlisted  # unknown if the claim fails
                claimed = self.claim(pending, lookout, was)
                pending = []
                lookout = not isinstance(claimed, tuple) and claimed > 0
                unlisted = one_slot and isinstance(claimed, tuple)
                if outage.since is not None:  # up's own first check, without its call a task
                    outage.up(started)
                backoff.reset()
                if isinstance(claimed, tuple):
                    from_idle, waited = waited, False
                    if self.blocked:
                        self.wake_sibling()
                    online = claimed[0][0].get("priority") in ("0", "1")
                    pending = batch.execute(self.executor, claimed[0], self.stopping, claimed[1])
                    continue
                handed = self.wait_for_work(claimed)
                waited = True
                if handed is True:  # woken as its shape's lookout
                    lookout = True
                elif isinstance(handed, tuple):
                    from_idle, waited, unlisted = True, False, one_slot
                    online = handed[0].get("priority") in ("0", "1")
                    pending = batch.execute(self.executor, handed, self.stopping, handed=True)
            except redis.RedisError as exc:  # down or restarting: said once, retried with backoff
                outage.down(exc)
                self.stopping.wait(backoff.delay())
            except Exception as exc:  # a runner must outlive any one task's surprise
                pending = self.executor.abandon(exc, pending)  # said; the runs it took end
                self.stopping.wait(1.0)
        if pending:  # stopping: the last results still go out
            try:
                self.settle(pending)
            except redis.RedisError as exc:
                log.error("task.ack_failed task=%s error=%s (the reaper will recover it)",
                          ",".join(c.args[0] for c in pending), exc)

    def request_stop(self, *signal_args: object) -> None:
        with self.stop_lock:  # a drain (heartbeat thread) and a signal (main thread) may cross
            if signal_args and self.draining:  # SIGTERM during a drain: the grace bounds it now
                self.draining = False
                log.info("worker.stopping worker=%s running=%d: the drain is cut to the %g s grace",
                         self.id, len(self.running), self.config.shutdown_grace_s)
            elif not self.stopping.is_set():
                log.info("worker.stopping worker=%s running=%d", self.id, len(self.running))
            elif signal_args and not self.hurry.is_set():  # a second signal: no more grace
                self.hurry.set()
                log.warning("worker.stopping worker=%s running=%d: a second signal, running tasks "
                            "are given back now", self.id, len(self.running))
            self.stopping.set()
            self.done.set()
        self.running.nudge()  # a batch waiting for more tasks runs now

    def serve_metrics(self, port: int) -> None:
        metrics = self.observer.metrics = WorkerMetrics(self.config.pool, self.id, self.gpu.name,
                                                             self.gpu.count)
        host = self.config.metrics_host  # loopback unless told: the endpoint has no authentication
        serve_http(metrics.registry, host, port, "metrics")
        log.info("worker.metrics worker=%s host=%s port=%d", self.id, host, port)

    def drain(self) -> None:
        """Take no more tasks; finish the running ones however long they take; exit 0."""
        with self.stop_lock:
            if not self.stopping.is_set():  # a stop that came first keeps its grace
                log.info("worker.draining worker=%s running=%d", self.id, len(self.running))
                self.draining = True
            self.request_stop()

    def run(self) -> int:
        cfg = self.config
        handover = None if self.burst else (int(cfg.defer_s * 1000), cfg.fair_every, int(cfg.lease_s * 1000))
        identity = worker_record.identity(self.id, self.gpu, cfg.kv_reserve_gb, cfg.concurrency, self.levels,
                                          socket.gethostname(), os.getpid(), handover, self.app.handlers,
                                          cfg.heartbeat_s)
        if self.config.metrics_port:  # first: a port it cannot bind must not leave it registered
            self.serve_metrics(self.config.metrics_port)
        # before registering: a signal right after it stops the worker (then it leaves), not kills it
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.request_stop)
            signal.signal(signal.SIGINT, self.request_stop)
        with redis_errors(self.config.redis_url):  # a twin beating within 1.5 heartbeats: refused
            self.presence.register(identity, int(cfg.lease_s * 1000), int(1500 * cfg.heartbeat_s),
                                   lambda: recovery.reap_all(self.scripts, self.calls, log, cfg.pool))
        heartbeat = self.heartbeat()
        with redis_errors(self.config.redis_url):  # gone since it registered: give up, one line
            heartbeat.beat()
        heartbeat.start()
        log.info("worker.started worker=%s pool=%s gpu=%s vram_gb=%g concurrency=%d levels=%s", self.id,
                 self.config.pool, self.gpu.name, self.gpu.total_gb, self.config.concurrency, self.levels)
        runners = [threading.Thread(target=self.runner, name=f"runner-{i}", daemon=True)
                   for i in range(self.config.concurrency)]
        for t in runners:
            t.start()
        follow_at = 0.0
        while not self.done.wait(0.5):
            try:
                if (now := time.monotonic()) >= follow_at:  # here, not in the heartbeat's thread:
                    follow_at = now + cfg.heartbeat_s  # a hung Sentinel must not delay a beat
                    follow_master(self.redis)
                leaving.check_idle(self)
            except redis.RedisError as exc:  # the runners and the heartbeat retry meanwhile
                self.outage.down(exc)
        leaving.shutdown(self, runners, heartbeat)
        log.info("worker.stopped worker=%s tasks=%d model_loads=%d", self.id,
                 self.running.tasks_run, self.executor.loading.count)
        return 0

    def heartbeat(self) -> Heartbeat:
        """The heartbeat thread (not started), with the control of this worker it serves."""
        control = Control(self.redis, self.keys, self.executor, self.running, stop_s=self.config.stop_s,
                          grace_s=self.config.grace_s, stopping=self.stopping, drain=self.drain)
        return Heartbeat(self.running, self.presence, self.cache, self.scripts, self.calls,
                         control, self.gpu, self.runtimes, period_s=self.config.heartbeat_s,
                         outage=self.outage, stopping=self.stopping, retired=self.retired,
                         metrics=self.observer.metrics, broken=self.executor.broken)
