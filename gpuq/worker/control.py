"""Control messages to a worker, and the enforcement of yield deadlines.

The reaper and the CLI push messages onto the worker's control list; the heartbeat thread
blocks on it between beats, so a request reaches the worker at once:

- ``yield <task> <grace_ms>``: a higher-priority task waits for this GPU. The handler sees
  ``ctx.should_yield()`` (a task still loading its model yields when the load ends, before
  its handler starts); past the grace the worker stops it itself: it requeues the task
  (fenced by its token, so exactly once; not if the request was withdrawn meanwhile, the
  ``unyield`` not read yet), tells the handler to stop and raises StopTask in
  its thread (an async handler: its asyncio task is cancelled). A handler stuck in native
  code (or blocking the event loop) cannot be stopped in-process: after ``stop_s`` more the
  worker requeues its other tasks and exits with EXIT_STUCK, for its supervisor to restart it.
- ``unyield <task>``: the task the yield was for started elsewhere or ended first: the
  request is withdrawn (``ctx.should_yield()`` is false again, no stop), unless the handler
  already yielded.
- ``reserved <task>``: the planner reserved this worker for a waiting task (its next claim
  takes it): a batch waiting to fill up runs at once.
- ``preload <model> <vram_gb>``: the reaper saw a backlog for a model this idle worker can
  hold; load it now so the tasks find it warm.
- ``drain``: take no more tasks, finish the running ones, exit 0 (``gpuq drain``).

A task whose lease is gone (``gpuq cancel``, or the reaper took it back from a worker it
thought dead), which the heartbeat learns, is stopped the same way once ``grace_s`` passes
(its handler sees ``ctx.should_stop()`` at once), with nothing to requeue: it is no longer
this worker's, and its slot and VRAM should go to work that counts. A batch stops once every
one of its tasks is lost (the others' results still count). A run whose task this worker
claimed again (superseded: gpuq.worker.running) is lost too: stopped past the grace, and
past ``stop_s`` more the worker exits with EXIT_STUCK, as for any handler that will not stop.

A handler call still running past its ``timeout_s`` (gpuq.app) fails its task, retryable
("ran past its 30 s timeout"), and its run is then lost like any other: the same grace, stop
and stuck exit. One that returns past it before that fail went out (Redis away, the worker
frozen) is failed by its runner instead of acked (Running.timed_out).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import redis

from gpuq.errors import GpuqError
from gpuq.keys import Keys
from gpuq.worker.executor import Executor
from gpuq.worker.models import Reservation
from gpuq.worker.running import Running, RunningSet

log = logging.getLogger(__name__)

EXIT_STUCK = 75  # a handler could not be stopped in-process; restart this worker


class Control:
    def __init__(self, client: redis.Redis, keys: Keys, executor: Executor, running: RunningSet,
                 *, stop_s: float, grace_s: float, stopping: threading.Event,
                 drain: Callable[[], None]) -> None:
        self.redis = client
        self.executor = executor
        self.running = running
        self.stop_s = stop_s
        self.grace_s = grace_s  # a task whose lease is gone has this long to stop by itself
        self.stopping = stopping  # the worker takes no more tasks: no preload either
        self.drain = drain
        self.id = executor.id
        self.key = keys.control(self.id)

    def receive(self, timeout: float) -> str | None:
        """The next message on the control list, waiting up to ``timeout`` seconds."""
        message = self.redis.blpop([self.key], timeout=max(0.01, timeout))
        return None if message is None else str(message[1])

    def wake(self) -> None:
        """Unblock a ``receive`` (shutdown)."""
        self.redis.lpush(self.key, "wake")

    def handle(self, message: str) -> None:
        verb, *args = message.split() or [""]
        try:
            if verb == "yield" and len(args) == 2:
                self.on_yield(args[0], int(args[1]))
            elif verb == "unyield" and len(args) == 1:
                self.on_unyield(args[0])
            elif verb == "lost" and len(args) == 2:
                self.on_told_lost(args[0], args[1])
            elif verb == "reserved" and len(args) == 1:
                self.running.nudge(reserved=True)
            elif verb == "preload" and len(args) == 2:
                self.preload(args[0], float(args[1]))
            elif verb == "drain" and not args:
                self.drain()
            elif verb != "wake":  # "wake": only unblocks the thread (shutdown)
                log.warning("control.unknown worker=%s message=%r", self.id, message)
        except ValueError:
            log.warning("control.malformed worker=%s message=%r", self.id, message)

    def on_yield(self, task_id: str, grace_ms: int) -> None:
        for r in self.running.snapshot():
            if r.task_id == task_id and r.yield_deadline is None:
                r.yield_deadline = time.monotonic() + grace_ms / 1000
                r.ctx.yield_requested = True
                self.running.nudge()  # a batch waiting for more tasks gives way now
                log.info("preempt.yield_requested task=%s worker=%s grace_s=%.3f", task_id,
                         self.id, grace_ms / 1000)

    def on_unyield(self, task_id: str) -> None:
        """The task the yield was for started elsewhere or ended: keep running, unless the
        handler already yielded or the worker already stopped it."""
        for r in self.running.snapshot():
            if r.task_id == task_id and r.yield_deadline is not None and not (r.stopped or r.leaving):
                r.yield_deadline = None
                r.ctx.yield_requested = False
                log.info("preempt.withdrawn task=%s worker=%s", task_id, self.id)

    def watch(self) -> float:
        """Stop tasks past their yield deadline, exit if one will not stop; returns seconds
        until the next deadline (inf: none)."""
        for r in self.running.superseded():
            if r.lost_deadline is None and r.stop_deadline is None:  # claimed again since
                self.on_lost(r)
        now = time.monotonic()
        nearest = self.time_out(now)
        for r in self.running.watched():
            if r.lost_deadline is not None and r.stop_deadline is None:
                if now >= r.lost_deadline:
                    self.stop_lost(r)
                else:
                    nearest = min(nearest, r.lost_deadline - now)
            if r.yield_deadline is None and r.stop_deadline is None:
                continue
            if r.yield_deadline is not None and not r.stopped:
                if now >= r.yield_deadline:
                    self.stop(r)
                else:
                    nearest = min(nearest, r.yield_deadline - now)
            if r.stop_deadline is not None:
                if now >= r.stop_deadline:
                    self.exit_stuck(r)
                nearest = min(nearest, r.stop_deadline - now)
        return nearest

    def stop(self, r: Running) -> None:
        ex = self.executor
        try:
            # the checkpoint its handler saved so far goes with it, as with a yield
            kept = ex.scripts.run(ex.calls.requeue(r.task_id, r.token, "stopped: did not yield in time",
                                                   preempted="stopped", checkpoint=r.ctx.saved or ""))
        except GpuqError as exc:  # it ended or was requeued meanwhile: nothing to stop
            r.yield_deadline = None
            log.info("preempt.stop_skipped task=%s worker=%s: %s", r.task_id, self.id, exc)
            return
        if kept == "kept":  # withdrawn before this worker read "unyield": it runs on
            self.on_unyield(r.task_id)
            return
        # only now: a handler that ended during the requeue sends its ack, which the
        # requeue fenced out (a Redis error leaves the stop to the next watch)
        r.stopped = True
        r.ctx.lost = True
        log.warning("preempt.stopped task=%s worker=%s: past its yield deadline", r.task_id,
                    self.id)
        r.stopped_as = "stopped"  # counted when its handler returns, its run phase first
        r.stop_deadline = time.monotonic() + self.stop_s
        r.interrupt()

    def time_out(self, now: float) -> float:
        """Fail the tasks of handler calls past their ``timeout_s`` (retryable, fenced: the
        task is no longer this run's), then treat each run as lost (``on_lost``):
        ``should_stop()`` at once, stopped past the grace, the worker's exit past ``stop_s``
        more. Returns seconds until the next bound, at most the app's shortest (a call
        starting now is looked at within it, not a heartbeat period later; inf: none)."""
        timed = [r for r in self.running.watched()
                 if r.run_deadline is not None and r.in_handler and not r.stopped]
        due = [r for r in timed if r.run_deadline is not None and now >= r.run_deadline]
        if due:  # a batch's tasks in one round trip (a Redis error: tried at the next watch)
            ex = self.executor
            calls = [ex.calls.fail(r.task_id, r.token, r.timeout_error)
                     for r in due]
            for r, call, reply in zip(due, calls, ex.scripts.pipelined(calls)):
                r.run_deadline = None
                try:
                    ended = call.parse(reply)
                except GpuqError as exc:  # it ended, or its lease went, meanwhile
                    log.info("task.timeout_skipped task=%s worker=%s: %s", r.task_id, self.id, exc)
                    continue
                r.stopped, r.stopped_as = True, "retried" if ended == "delayed" else "failed"
                log.warning("task.timed_out task=%s worker=%s timeout_s=%g outcome=%s: its handler "
                            "is stopped past the grace", r.task_id, self.id, r.timeout_s, r.stopped_as)
                self.on_lost(r)
        left = [r.run_deadline - now for r in timed if r.run_deadline is not None]
        bounds = [s.timeout_s for s in self.executor.app.handlers.values() if s.timeout_s is not None]
        return min([*left, *bounds], default=float("inf"))

    def on_told_lost(self, task_id: str, token: str) -> None:
        """A cancel or an operator's requeue took the task's run under ``token`` away: as
        when a heartbeat finds its lease gone, now rather than at the next beat."""
        for r in self.running.snapshot():
            if r.task_id == task_id and str(r.token) == token and not r.ctx.lost:
                log.warning("lease.lost task=%s worker=%s: canceled or taken back", task_id, self.id)
                self.on_lost(r)

    def on_lost(self, r: Running) -> None:
        """The task's lease is gone: its handler sees ``ctx.should_stop()``; past the grace
        the worker stops it (``stop_lost``)."""
        r.ctx.lost = True
        if r.lost_deadline is None:
            r.lost_deadline = time.monotonic() + self.grace_s

    def stop_lost(self, r: Running) -> None:
        """Stop a handler still running a task (or a batch of tasks) it lost, as ``stop``
        does, with nothing to requeue; a batch with a task it still holds runs on. Not in its
        handler yet (its model still loading: a load is no stuck handler), it is marked
        stopped, so its handler never starts, and looked at again after another grace."""
        r.lost_deadline = None
        runs = [o for o in self.running.watched() if o.thread_id == r.thread_id] or [r]
        if not all(o.ctx.lost for o in runs):
            return
        if not any(o.in_handler for o in runs):
            for o in runs:
                o.stopped = True
            r.lost_deadline = time.monotonic() + self.grace_s
            return
        until = time.monotonic() + self.stop_s
        for o in runs:
            o.stopped, o.lost_deadline, o.stop_deadline = True, None, until
            why = ("its lease is gone (canceled, or taken back)" if o.stopped_as == "lost"
                   else "it ran past its timeout")
            log.warning("task.stopped task=%s worker=%s: %s and it did not stop within %g s",
                        o.task_id, self.id, why, self.grace_s)
        r.interrupt()

    def exit_stuck(self, r: Running) -> None:
        ex = self.executor
        log.error("worker.stuck worker=%s task=%s: the handler did not stop within %.1f s; "
                  "exiting with code %d for the supervisor to restart this worker", self.id,
                  r.task_id, self.stop_s, EXIT_STUCK)
        for other in self.running.snapshot():
            if other.stopped:
                continue
            try:
                ex.scripts.run(ex.calls.requeue(other.task_id, other.token, "worker restarted",
                                                checkpoint=other.ctx.saved or ""))
                # as at a shutdown: its attempt given back, its handler maybe started
                log.warning("task.requeued task=%s worker=%s reason=stuck", other.task_id, self.id)
            except (GpuqError, redis.RedisError) as exc:
                log.error("task.requeue_failed task=%s error=%s (the reaper will recover it)",
                          other.task_id, exc)
        try:
            ex.presence.leave(ex.cache.model_names())
        except redis.RedisError as exc:
            log.error("worker.leave_failed worker=%s error=%s", self.id, exc)
        logging.shutdown()
        os._exit(EXIT_STUCK)

    def preload(self, model: str, vram_gb: float) -> None:
        cache = self.executor.cache
        with cache.lock:
            if self.stopping.is_set() or model in cache.resident:
                return
            if cache.app.model_spec(model) is None:  # a model of another app's tasks
                log.info("model.preload_skipped worker=%s model=%s: no loader in app %s",
                         self.id, model, cache.app.name)
                return
            # as claims skip it: a hint must not evict idle models for a load that fails here
            if self.executor.broken.skipping(model):
                log.info("model.preload_skipped worker=%s model=%s: its load failed here lately",
                         self.id, model)
                return
            res = cache.reserve(model, vram_gb)
        if res is None:
            log.info("model.preload_skipped worker=%s model=%s: no room", self.id, model)
            return
        threading.Thread(target=self._load, args=(res,), name=f"preload-{model}", daemon=True).start()

    def _load(self, res: Reservation) -> None:
        try:
            self.executor.loading.prepare(res)
            log.info("model.preloaded worker=%s model=%s", self.id, res.model)
        except Exception as exc:  # the next task for it retries the load
            log.error("model.preload_failed worker=%s model=%s error=%s", self.id, res.model, exc)
        finally:
            self.executor.cache.release(res)
