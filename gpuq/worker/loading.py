"""A worker's model loads and evictions, as the pool sees them.

What a load or an eviction changes goes to Redis at once (``Presence.show``): the holders
sets the wake rule and the holder wait read, the worker hash's models and free VRAM, and the
model catalog's load record. A task's load holds its model from its start, as a replay's
does, so batch work of the model waits for this worker instead of loading it on another GPU
meanwhile; a preload holds it once loaded; a failed load leaves the holders. With Redis away
the load goes on and the next beat sends the holdings (``Presence.resync``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis

from gpuq import catalog
from gpuq.errors import ModelLoadFailed
from gpuq.worker.broken import Broken
from gpuq.worker.models import ModelCache, Reservation
from gpuq.worker.observer import Observer
from gpuq.worker.outcome import failure
from gpuq.worker.presence import Presence

log = logging.getLogger(__name__)


class Loading:
    def __init__(self, cache: ModelCache, presence: Presence, broken: Broken, observer: Observer,
                 gpus: int = 1) -> None:
        self.cache = cache
        self.presence = presence
        self.id = presence.worker_id
        self.broken = broken  # models whose load failed here
        self.observer = observer
        self.gpus = gpus  # devices in the worker's group
        self.count = 0  # loads done

    def prepare(self, res: Reservation, task_id: str = "") -> Any:
        """Unload what must make room, load the model if this task (``task_id``; none: a
        preload) is the one to, return it."""
        cache = self.cache
        resident = cache.resident[res.model]  # cache.get's lookup: one call fewer a task
        # a task's load holds its model from its start (as a replay's does): batch work of
        # the model waits for this worker rather than load it on another GPU meanwhile
        announced = res.cold and bool(task_id)
        if announced:
            resident.shown = True
        if res.evict or announced:
            pipe = self.presence.pipeline()
            for old in res.evict:  # for a cold load, or a held model's task's working memory
                if cache.unload(old):
                    log.info("model.evicted worker=%s model=%s", self.id, old.spec.name)
            if res.evict:  # their memory is free only now (models.ModelCache.unloading):
                # another runner of this worker whose claim found no room looks again
                pipe.lpush(self.presence.keys.wake(self.id), "1")
            # before a load: until then wake-ups would still pick this worker
            dropped = [old.spec.name for old in res.evict]
            held = [res.model] if announced else []
            self.publish(lambda: self.presence.show(cache, pipe, held=held, dropped=dropped))
        if not res.cold:
            resident.ready.is_set() or resident.ready.wait()  # set: no Condition taken
            if resident.error is not None:
                raise ModelLoadFailed(res.model, failure(resident.error)[0])
            return resident.obj
        try:
            seconds = cache.load(resident)
        except BaseException as exc:
            if resident.shown:  # held no more (its error keeps it out of model_names)
                self.publish(lambda: self.presence.show(cache, dropped=[res.model]))
            if not isinstance(exc, (Exception, SystemExit, KeyboardInterrupt)):  # a cancel
                raise
            # a loader's sys.exit() or KeyboardInterrupt is its failure, as a handler's is
            count, skip_s = self.broken.failed(res.model)
            self.observer.load_failed(res.model)
            log.warning("model.load_failed worker=%s model=%s error=%s failures=%d skipped_s=%g",
                        self.id, res.model, failure(exc)[0], count, skip_s,
                        exc_info=exc)  # the task's error is one line: where is here
            raise ModelLoadFailed(res.model, failure(exc)[0]) from None
        if self.broken.loaded(res.model):
            log.info("model.mended worker=%s model=%s: its tasks are claimed again", self.id, res.model)
        pipe = self.presence.pipeline()
        catalog.record_load(pipe, self.presence.keys, res.model, resident.footprint_gb, seconds,
                            self.task_gpus(task_id))
        self.publish(lambda: self.presence.show(cache, pipe, held=[res.model]))
        self.count += 1
        self.observer.observe(task_id, phase="load", seconds=seconds)
        log.info("model.loaded worker=%s model=%s vram_gb=%g load_s=%.3f", self.id, res.model,
                 resident.footprint_gb, seconds)
        return resident.obj

    def task_gpus(self, task_id: str) -> int:
        """The GPUs the task a load is for asks, for the catalog (0: a preload, or unknown).
        A one-GPU worker runs only one-GPU tasks; a group reads the task's field (a round
        trip per cold load), so the reaper's forecast never preloads onto fewer GPUs a model
        whose tasks ran at once on a group, never seen in a queue."""
        if not task_id:
            return 0
        if self.gpus <= 1:
            return 1
        try:
            got = self.presence.redis.hget(self.presence.keys.task(task_id), "gpus")
            return max(1, int(got or 1))
        except (redis.RedisError, ValueError):
            return 0

    def publish(self, show: Callable[[], None]) -> None:
        """Tell the pool what a load or an eviction changed; with Redis away the task goes on
        (its model is loaded: failing it would spend an attempt on an outage), the holdings
        wait for the next beat (Presence.resync) and the load's timing is not recorded."""
        try:
            show()
        except redis.RedisError as exc:
            log.warning("presence.unsent worker=%s error=%s: holdings sent at the next beat",
                        self.id, exc)
