"""How a worker leaves the pool: it retires once idle past its timeout, and a stop ends in
its shutdown (the runners joined within the grace, what still runs and the hand-overs no
runner read given back, the pool left, the models unloaded). The Worker (gpuq.worker.loop)
calls these from its main thread."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Protocol

import redis

from gpuq.clock import server_ms
from gpuq.config import Config
from gpuq.keys import Keys
from gpuq.scripts import Calls, Scripts
from gpuq.worker.executor import Executor
from gpuq.worker.heartbeat import Heartbeat
from gpuq.worker.models import ModelCache
from gpuq.worker.presence import Presence
from gpuq.worker.running import RunningSet
from gpuq.worker.takeup import handed_over
from gpuq.worker_record import field_number

log = logging.getLogger(__name__)


class LeavingWorker(Protocol):
    """What leaving reads and sets of a worker (gpuq.worker.loop.Worker)."""

    id: str
    config: Config
    burst: bool
    draining: bool
    redis: redis.Redis
    keys: Keys
    scripts: Scripts
    calls: Calls
    cache: ModelCache
    running: RunningSet
    presence: Presence
    executor: Executor
    stopping: threading.Event
    retired: threading.Event
    hurry: threading.Event

    def request_stop(self, *signal_args: object) -> None: ...

    def give_back(self, task_id: str, token: int, until: float = 0.0, checkpoint: str = "") -> None: ...


def put_back_parked(w: LeavingWorker) -> int:
    """A burst worker about to leave for want of work: the parked tasks the live workers
    (itself among them) can now hold go back to their queues first (park.lua, as the
    reaper's next pass would, after this worker had left). Returns how many went back."""
    if not w.redis.zcard(w.keys.parked):  # the usual case: nothing parked, nothing more read
        return 0
    now = server_ms(w.redis)
    live = [str(x) for x in w.redis.zrangebyscore(w.keys.workers, now, "+inf")]
    shapes = set()
    for cap in w.redis.hmget(w.keys.capacities, live) if live else ():
        words = str(cap or "").split()
        if len(words) >= 2:  # "<usable GB> <gpus> <levels>" (gpuq.worker.presence)
            shapes.add((field_number(words[0]), int(field_number(words[1])) or 1))
    if not shapes:
        return 0
    _, put_back, _ = w.scripts.run(w.calls.park(sorted(shapes), limit=1000))
    if put_back:
        log.info("task.unparked worker=%s put_back=%d: a burst worker came for them", w.id, put_back)
    return int(put_back)


def check_idle(w: LeavingWorker) -> None:
    """Idle past the timeout: retire, unloading the models, unless the pool is at its
    minimum; then stay with the models loaded (the next task for one of them starts warm;
    they go only to make room) and look again after another timeout."""
    timeout = w.config.idle_timeout_s
    if timeout <= 0 or w.burst or w.stopping.is_set():
        return
    with w.cache.lock:  # claims hold it too: none can start while this decides
        if len(w.running) or w.running.idle_s() < timeout:
            return
        retired, live = w.scripts.run(w.calls.retire(w.id))
        if retired:
            w.retired.set()  # the heartbeat stops beating: it would list us again
            w.stopping.set()
            unloaded = w.cache.evict_idle()
        else:
            w.running.touch()
            unloaded = []
    if unloaded:
        w.cache.unload_all(unloaded, time.monotonic() + w.config.shutdown_grace_s, w.hurry)
        names = [r.spec.name for r in unloaded]
        try:  # retire dropped the holdings already: only the hash's view is late
            w.presence.show(w.cache, dropped=names)
        except redis.RedisError as exc:  # raised, it would leave the worker stopping for good
            log.warning("presence.unsent worker=%s error=%s", w.id, exc)
        log.info("worker.idle_unloaded worker=%s models=%s", w.id, ",".join(names))
    if retired:
        log.info("worker.retiring worker=%s idle_s=%.0f live_workers=%d", w.id, timeout, live)
        w.request_stop()
    else:
        log.info("worker.idle_stays worker=%s live_workers=%d models=%s: the pool is at its "
                 "minimum", w.id, live, ",".join(w.cache.model_names()))


def join_runners(w: LeavingWorker, runners: list[threading.Thread]) -> float:
    """Wait for the runners (each exits after its last ack) for ``shutdown_grace_s``; a
    drain waits however long they take, until a SIGTERM cuts it to the grace from then.
    What still runs ``yield_window`` before the grace ends is asked to yield. Returns when
    the grace ends (monotonic)."""
    grace_end = time.monotonic() + w.config.shutdown_grace_s
    while w.draining and any(t.is_alive() for t in runners):
        for t in runners:
            t.join(0.2)
        grace_end = time.monotonic() + w.config.shutdown_grace_s
    ask_at = grace_end - yield_window(w.config)
    while not w.hurry.is_set() and (alive := [t for t in runners if t.is_alive()]):
        if (left := grace_end - (now := time.monotonic())) <= 0:
            break
        if now >= ask_at:
            ask_to_yield(w, left)
            ask_at = math.inf
        alive[0].join(min(0.1, left))  # a second signal cuts the grace short
    return grace_end


def yield_window(config: Config) -> float:
    """How long before its shutdown grace ends a worker asks its running tasks to yield: the
    planner's ``grace_s`` (a handler's time to save a checkpoint), within the first half
    of the grace left to finish them."""
    return min(config.grace_s, config.shutdown_grace_s / 2)


def ask_to_yield(w: LeavingWorker, left: float) -> None:
    """Ask every run to give way (``ctx.should_yield()``): a handler that saves a checkpoint
    and yields goes back with it now, as a give-back does, rather than lose its progress at
    the grace's end; one still loading its model yields when the load ends."""
    runs = [r for r in w.running.snapshot() if not (r.stopped or r.ctx.lost)]
    for r in runs:
        r.leaving = r.ctx.yield_requested = True
    w.running.nudge()
    if runs:
        log.info("worker.yield_asked worker=%s tasks=%d grace_left_s=%.1f", w.id, len(runs), left)


def give_back_unread(w: LeavingWorker) -> None:
    """Tasks handed over at enqueue that no runner read (left behind the stop wake-ups)
    go back to their queues before leaving deletes the wake list."""
    try:
        unread = w.redis.lrange(w.keys.wake(w.id), 0, -1)
    except redis.RedisError:
        return  # a claim or the reaper takes them back at their pickup deadline
    for fields in filter(None, map(handed_over, unread)):
        w.give_back(fields["id"], int(fields["token"]))


def shutdown(w: LeavingWorker, runners: list[threading.Thread], heartbeat: Heartbeat) -> None:
    w.stopping.set()
    try:  # unblock runners waiting on their wake list
        w.redis.lpush(w.keys.wake(w.id), *["stop"] * len(runners))
    except redis.RedisError:
        pass
    grace_end = join_runners(w, runners)
    # with Redis away, keep trying the give-backs to the grace's end (at least stop_s)
    until = max(grace_end, time.monotonic() + w.config.stop_s)
    for r in [r for r in w.running.snapshot() if not r.stopped]:  # stopped: requeued
        w.give_back(r.task_id, r.token, until, r.ctx.saved or "")
        r.stopped = r.ctx.lost = True  # no longer ours: its handler's end is moot
    give_back_unread(w)
    heartbeat.stop()  # before leaving: a late beat would list this worker again
    held = w.cache.model_names()
    evicted = w.cache.evict_idle()
    try:  # before the unloads: a worker still listed idle would be handed tasks meanwhile
        w.presence.leave(held, until)
    except redis.RedisError as exc:
        log.error("worker.leave_failed worker=%s error=%s", w.id, exc)
    w.cache.unload_all(evicted, max(until, time.monotonic() + w.config.stop_s), w.hurry)
    w.cache.aio.close()  # async tasks still running past the grace are cancelled
    w.executor.takeups.close()
