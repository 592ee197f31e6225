"""How a worker shows itself to the pool: its hash, its GPU class, the models it holds.

``Presence`` is the only writer of a worker's hash (``keys.worker(id)``), of its place in
the holders sets, the GPU classes, handler names and lanes, and of its liveness until the
first heartbeat. These are plain writes (no reads), so they go in pipelines rather than
scripts. The hash's fields are ``gpuq.worker_record``'s; docs/PROTOCOL.md tables them.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from gpuq.backoff import Backoff
from gpuq.clock import server_ms
from gpuq.errors import ConfigError
from gpuq.keys import Keys
from gpuq.worker.models import ModelCache
from gpuq.worker_record import ALL_LEVELS, Fields, field_number, lane, model_fields, status_fields, usable_gb

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shown:
    """A heartbeat's view of the worker, and the HSET that writes it."""

    free_gb: float
    models: list[str]
    command: tuple[Any, ...]


class Presence:
    def __init__(self, client: redis.Redis, keys: Keys, worker_id: str) -> None:
        self.redis = client
        self.keys = keys
        self.worker_id = worker_id
        self.identity: Fields = {}  # the fields that do not change: rewritten by every beat
        self._shown = threading.Lock()  # the hash's view of the models: taken and written in turn
        # models dropped while a show could not be sent (Redis away): the next beat's ``resync``
        # publishes the holdings whole; None while every show went through
        self.unsent: set[str] | None = None

    def register(self, identity: Fields, lease_ms: int, fresh_ms: int = 0,
                 recover: Callable[[], object] | None = None) -> None:
        """Appear in the pool: a fresh hash, the GPU class, handlers, lane and liveness. A
        live worker of this id that beat within ``fresh_ms`` (or 1.5 of its own beat periods,
        if longer) is waited for until that long after its beat: if it beat again, it is
        another process (ConfigError: registering would wipe its state); one that stopped
        beating (this id's crashed process, restarted at once by its supervisor, or later) is
        replaced, the holdings it listed dropped. ``recover`` (gpuq.recovery.reap_all) is then
        run with that run's liveness lapsed: its tasks go back to their queues at once, as the
        reaper's next round would have sent them had this start not renewed the id (their
        leases would have held them until they expired)."""
        wid, keys = self.worker_id, self.keys
        for look in range(2):
            now_ms = server_ms(self.redis)  # the clock liveness is judged by
            pipe = self.redis.pipeline(transaction=False)
            pipe.zscore(keys.workers, wid)
            pipe.hmget(keys.worker(wid), "seen_at", "models", "heartbeat_ms")
            alive, (seen, models, period) = pipe.execute()
            # its own beat's period counts: a run beating every 20 s is not dead 7.5 s after a beat
            fresh = max(fresh_ms, 1.5 * field_number(period)) if fresh_ms else 0.0  # 0: no check
            live = alive is not None and alive > now_ms and seen
            ago = max(0.0, now_ms - float(seen)) if live else fresh
            if ago >= fresh:
                break
            if look:
                raise ConfigError(f"worker {wid} is already running (it beat {ago / 1000:.1f} s "
                                  "ago): give this one another --name")
            log.info("worker.waiting worker=%s: a run of this id beat %.1f s ago; registering if it "
                     "misses its next beat", wid, ago / 1000)
            time.sleep((fresh - ago) / 1000 + 0.05)
        if alive is not None and recover is not None:
            log.warning("worker.replacing worker=%s: its last run stopped beating", wid)
            self.redis.zadd(keys.workers, {wid: now_ms - 1}, xx=True, lt=True)
            recover()
        pipe = self.redis.pipeline(transaction=True)
        for model in filter(None, (models or "").split(",")):
            self.hold(pipe, model, False)
        self.add_registration(pipe, identity, lease_ms, now_ms)
        pipe.execute()

    def add_registration(self, pipe: redis.client.Pipeline, identity: Fields, lease_ms: int,
                         now_ms: int) -> None:
        """``register``'s writes, added to a pipeline (the simulator registers a whole pool
        in one), live until now_ms + lease_ms."""
        wid, keys = self.worker_id, self.keys
        self.identity = identity
        usable = usable_gb(identity["vram_total_gb"], identity["kv_reserve_gb"])
        pipe.delete(*self._own_keys())
        pipe.hset(keys.worker(wid), mapping={
            **identity, **status_fields(usable, 0, [], "idle", None), "seen_at": now_ms})
        self.add_published(pipe)
        # the heartbeat's script renews it from here on; this bridges until the first beat
        pipe.zadd(keys.workers, {wid: now_ms + lease_ms})
        pipe.incr(keys.registrations)  # the planner's kept GPU fields may be another start's

    def add_published(self, pipe: redis.client.Pipeline, skipped: Sequence[tuple[str, int]] = (),
                      now_ms: int = 0) -> None:
        """What the pool learns of this worker beside its hash: its GPU class (and a group's
        size), its capacity (read for busy holders: lib/holders.lua), its app's handlers and
        its lane, listing the models its claims skip (``skipped``: name, ms left from the
        server's now_ms; gpuq.worker.broken), as its claims list them."""
        wid, keys, identity = self.worker_id, self.keys, self.identity
        usable = usable_gb(identity["vram_total_gb"], identity["kv_reserve_gb"])
        pipe.hset(keys.classes, identity["gpu_name"], usable)
        pipe.hset(keys.capacities, wid, f"{usable!r} {int(identity['gpus'])} {identity['levels']}")
        if int(identity["gpus"]) > 1:  # enqueue's check_fit: a class of groups holds multi-GPU tasks
            pipe.hset(keys.class_gpus, identity["gpu_name"], identity["gpus"])
        if identity["handlers"]:
            pipe.sadd(keys.handlers, *identity["handlers"].split(","))
        if identity["levels"] == ALL_LEVELS and not skipped:
            pipe.hdel(keys.lanes, wid)
        else:  # wake-ups and offers skip a lane worker for the priorities it does not serve
            pipe.hset(keys.lanes, wid, lane(identity["levels"], skipped, now_ms))
        for level in ALL_LEVELS:  # idle holders that serve a level: one ZINTER (lib/holders.lua)
            if level in identity["levels"]:
                pipe.sadd(keys.serving(level), wid)
            else:
                pipe.srem(keys.serving(level), wid)

    @contextmanager
    def beat(self, cache: ModelCache, running: int, state: str,
             nvml_used_gb: float | None) -> Iterator[Shown]:
        """The whole hash as the heartbeat rewrites it; the caller sends ``command`` inside
        the block, so a runner's newer view of the models is not overwritten by this one."""
        with self._shown:
            with cache.lock:
                free, models = cache.free_gb(), cache.model_names()
            fields: Fields = {**self.identity,
                              **status_fields(free, running, models, state, nvml_used_gb)}
            command = ("HSET", self.keys.worker(self.worker_id),
                       *itertools.chain.from_iterable(fields.items()))
            yield Shown(free, models, command)

    def show(self, cache: ModelCache, pipe: redis.client.Pipeline | None = None, *,
             held: Iterable[str] = (), dropped: Iterable[str] = ()) -> None:
        """Send ``pipe`` (or a new one) with the models held and dropped, and the hash's
        view of the models and free VRAM (for status, top and the wake rule), taken and
        written in turn with the heartbeat's."""
        pipe = pipe if pipe is not None else self.pipeline()
        for model in dropped:
            self.hold(pipe, model, False)
        for model in held:
            self.hold(pipe, model, True)
        with self._shown:
            with cache.lock:  # other runners may be changing the ledger
                shown = model_fields(cache.free_gb(), cache.model_names())
            pipe.hset(self.keys.worker(self.worker_id), mapping=shown)
            try:
                pipe.execute()
            except redis.RedisError:
                self.unsent = (self.unsent or set()) | set(dropped)
                raise

    def resync(self, cache: ModelCache) -> None:
        """After shows that could not be sent: the holdings as the cache has them (each model
        held, each dropped since and not held again out of its holders); the beat already
        rewrote the hash's view."""
        with self._shown:
            if self.unsent is None:
                return
            with cache.lock:
                held = cache.model_names()
            pipe = self.pipeline()
            for model in self.unsent - set(held):
                self.hold(pipe, model, False)
            for model in held:
                self.hold(pipe, model, True)
            pipe.execute()
            self.unsent = None

    def pipeline(self) -> redis.client.Pipeline:
        return self.redis.pipeline(transaction=False)

    def hold(self, pipe: redis.client.Pipeline, model: str, held: bool) -> None:
        """Add to ``pipe`` this worker's entry in (or out of) the model's holders."""
        if held:
            pipe.sadd(self.keys.holders(model), self.worker_id)
        else:
            pipe.srem(self.keys.holders(model), self.worker_id)

    def restore(self, cache: ModelCache, skipped: Sequence[tuple[str, int]] = ()) -> None:
        """Hold again what the cache holds, after the reaper took this worker for dead and
        dropped its holdings (under the cache's lock, so no eviction slips in between), and
        publish its class, handlers and lane again (Redis may have restarted empty: enqueue
        would find no class to fit a task). The lane lists the models its claims skip
        (``skipped``: Broken.skipped): a runner's claim may have listed the worker idle
        again before this, and offers would go to it for those models until its next claim."""
        now_ms = server_ms(self.redis) if skipped else 0  # the clock claims list skips on
        with cache.lock:
            pipe = self.pipeline()
            for model in cache.model_names():
                self.hold(pipe, model, True)
            if self.identity:
                self.add_published(pipe, skipped, now_ms)
            pipe.execute()

    def leave(self, models: list[str], until: float = 0.0) -> None:
        """Clean exit: nothing of this worker is left for the reaper to recover. With Redis
        away, tried again with backoff until ``until`` (monotonic): a worker still listed
        idle would be handed tasks until its lease ran out."""
        wid, keys = self.worker_id, self.keys
        backoff = Backoff()
        while True:
            pipe = self.redis.pipeline(transaction=True)
            for model in models:
                self.hold(pipe, model, False)
            pipe.zrem(keys.idle, wid)
            pipe.zrem(keys.workers, wid)
            pipe.hdel(keys.lanes, wid)
            pipe.hdel(keys.capacities, wid)
            for level in ALL_LEVELS:
                pipe.srem(keys.serving(level), wid)
            pipe.delete(*self._own_keys())
            try:
                pipe.execute()
                return
            except redis.RedisError:
                if not backoff.pause_until(until):
                    raise

    def _own_keys(self) -> tuple[str, ...]:
        """The keys named after this worker: fresh at registration, gone when it leaves."""
        wid, keys = self.worker_id, self.keys
        return (keys.worker(wid), keys.worker_tasks(wid), keys.wake(wid), keys.control(wid),
                keys.reservation(wid))
