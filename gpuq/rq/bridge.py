"""``gpuq rq-bridge``: moves jobs from RQ queues into gpuq tasks without losing one.

Each move is three steps, each safe to repeat:

1. take: ``LMOVE`` the job id from RQ's queue list to the bridge's taken list
   (``Keys.rq_taken``) on RQ's Redis, atomically: the id is always in one of the two lists;
2. deliver: read the job with RQ's Job class (through the restricted unpickler), enqueue the
   gpuq task whose id derives from the job's (``fields.task_id_for``); DuplicateTask means
   an earlier run already did, or mark the job failed in RQ if it cannot become a task;
3. drop the id from the taken list.

A bridge killed anywhere leaves the id in a list: a (re)started bridge delivers whatever its
taken list holds before taking more, and the deterministic task id makes that idempotent.
So the bridge needs no shutdown handling; SIGTERM and SIGKILL are equally safe.

The bridge also closes the loop the other way: its tasks are enqueued with ``report_end``, so
one that ends without its handler's word (canceled, expired, failed by the reaper on its last
attempt, refused by a worker that has no rq handler) is listed in ``ended`` by the scripts, and
the bridge marks its RQ job canceled or failed, unless RQ already shows an end, so no producer
waits on a job gpuq has given up.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import redis
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.queue import Queue as RqQueue

from gpuq.backoff import Backoff, Outage
from gpuq.client import Queue
from gpuq.connection import redis_errors
from gpuq.errors import ConnectionFailed, DuplicateTask, TaskNotFound
from gpuq.redact import one_line
from gpuq.rq import outcome
from gpuq.rq.fields import JobRefused, task_id_for, task_spec
from gpuq.rq.unpickle import Allowlist, RestrictedSerializer
from gpuq.task import State

log = logging.getLogger(__name__)

# test hook, documented as such: "<step>:<seconds>" makes the bridge sleep right after a step
# ("taken" or "enqueued") so a test can kill it at a known point
PAUSE_ENV = "GPUQ_RQ_BRIDGE_PAUSE"
ENDED_BATCH = 100  # ended tasks reported per pass
RQ_ENDED = (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.STOPPED)


def text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


class Bridge:
    def __init__(self, queue: Queue, rq_redis: redis.Redis, rq_url: str, rq_queues: list[str],
                 defaults: Mapping[str, Any], *, burst: bool = False) -> None:
        self.queue = queue
        self.rq = rq_redis
        self.rq_url = rq_url
        self.names = list(dict.fromkeys(rq_queues))
        self.defaults = dict(defaults)
        self.burst = burst
        # the bridge needs only the job's meta, which is plain data: nothing is allowed
        self.serializer = RestrictedSerializer(Allowlist(()))
        step, _, seconds = os.environ.get(PAUSE_ENV, "").partition(":")
        self.pause = (step, float(seconds or 0)) if step else None
        self.delivered = 0
        self.refused = 0

    def run(self) -> int:
        """Recover, then move jobs until stopped (or, in burst mode, until every queue is
        empty). A Redis it cannot reach at start ends it (ConnectionFailed); one lost later
        is waited out with backoff, as a worker does, and the taken lists recovered again (a
        move cut mid-way)."""
        try:
            with redis_errors(self.rq_url):
                self.recover()
            turn, backoff, outage = 0, Backoff(), Outage("bridge", log)
            while True:
                started = time.monotonic()
                try:
                    if outage.since is not None:
                        self.recover()
                    self.report_ended()
                    moved = any([self.move(name, 0) for name in self.names])
                    outage.up(started)
                    backoff.reset()
                    if moved:
                        continue
                    if self.burst:
                        return 0
                    # idle: block on one queue at a time (BLMOVE takes one source), a second each
                    name = self.names[turn % len(self.names)]
                    turn += 1
                    self.move(name, 1)
                except (redis.ConnectionError, redis.TimeoutError, ConnectionFailed) as exc:
                    outage.down(exc)
                    time.sleep(backoff.delay())
        except KeyboardInterrupt:
            return 0

    def recover(self) -> None:
        for name in self.names:
            for raw in self.rq.lrange(self.queue.keys.rq_taken(name), 0, -1):
                log.info("rq.recovered queue=%s job=%s", name, text(raw))
                self.deliver(name, text(raw))

    def move(self, name: str, block_s: int) -> bool:
        source, taken = RqQueue(name, connection=self.rq).key, self.queue.keys.rq_taken(name)
        raw = (self.rq.blmove(source, taken, block_s, "LEFT", "RIGHT") if block_s
               else self.rq.lmove(source, taken, "LEFT", "RIGHT"))
        if raw is None:
            return False
        self.hook("taken")
        self.deliver(name, text(raw))
        return True

    def deliver(self, name: str, job_id: str) -> None:
        try:
            job = Job.fetch(job_id, connection=self.rq, serializer=self.serializer)
        except NoSuchJobError:  # deleted in RQ after it was queued: nothing to run or mark
            log.warning("rq.vanished queue=%s job=%s", name, job_id)
            self.drop(name, job_id)
            return
        except redis.RedisError:
            raise
        except Exception as exc:  # a damaged job hash: RQ cannot read it, nor be told about it
            self.refused += 1
            log.error("rq.unreadable queue=%s job=%s error=%s: %s (dropped)", name, job_id,
                      type(exc).__name__, one_line(str(exc)))
            self.drop(name, job_id)
            return
        if job.get_status(refresh=False) in (JobStatus.CANCELED, JobStatus.STOPPED):
            log.info("rq.skipped queue=%s job=%s status=%s", name, job_id, job.get_status(refresh=False))
            self.drop(name, job_id)
            return
        try:
            spec = task_spec(job.id, name, job.enqueued_at, job.meta, self.defaults, job.retries_left)
            self.queue.scripts.run(self.queue.calls.enqueue([spec]))
            self.delivered += 1
            log.info("rq.delivered queue=%s job=%s task=%s model=%s priority=P%d", name, job_id,
                     spec.task_id, spec.model, spec.priority)
        except DuplicateTask as exc:
            log.info("rq.already_delivered queue=%s job=%s task=%s", name, job_id, exc.task_id)
        except JobRefused as exc:
            self.refused += 1
            log.warning("rq.refused queue=%s job=%s reason=%s", name, job_id, exc.reason)
            outcome.failed(job, str(exc))
        self.hook("enqueued")
        self.drop(name, job_id)

    def report_ended(self) -> None:
        """Write to RQ the ends of tasks whose handler never reported (``ended``), oldest
        first; an id leaves the list only once RQ shows an end, so a killed bridge redoes it."""
        ended = self.queue.keys.ended
        for raw in reversed(self.queue.redis.lrange(ended, -ENDED_BATCH, -1)):
            task_id = text(raw)
            self.report_end(task_id)
            self.queue.redis.lrem(ended, -1, task_id)

    def report_end(self, task_id: str) -> None:
        try:
            record = self.queue.record(task_id)
        except TaskNotFound:  # its result TTL ran out: nothing left to say
            return
        job_id = record.payload.get("rq_job") if isinstance(record.payload, dict) else None
        if not isinstance(job_id, str):
            return
        try:
            job = Job.fetch(job_id, connection=self.rq, serializer=self.serializer)
        except NoSuchJobError:
            return
        except redis.RedisError:
            raise
        except Exception as exc:  # a damaged job hash: its end cannot be written
            log.error("rq.unreadable job=%s task=%s error=%s: %s (its end not reported)", job_id,
                      task_id, type(exc).__name__, one_line(str(exc)))
            return
        if task_id_for(job.id, job.enqueued_at) != task_id:
            # RQ enqueued the job again since (a requeue sets a new enqueued_at): this end
            # belongs to an earlier run, and the job's current one must not be marked by it
            log.info("rq.end_superseded job=%s task=%s", job_id, task_id)
            return
        status = job.get_status(refresh=False)
        if status in RQ_ENDED:  # the handler (or RQ) already said
            return
        if not record.state.terminal:
            # back in its queue after its worker died or lost the lease: RQ showed the dead
            # run as started; a run that started since (running) reports for itself
            if status == JobStatus.STARTED and record.state is not State.RUNNING:
                outcome.queued_again(job)
                log.info("rq.queued_again job=%s task=%s error=%s", job_id, task_id, record.error or "")
            return
        if record.state is State.CANCELED:
            job.cancel()
        else:
            outcome.failed(job, f"gpuq task {task_id} ended {record.state.value}: {record.error or ''}")
        log.info("rq.ended job=%s task=%s state=%s", job_id, task_id, record.state.value)

    def drop(self, name: str, job_id: str) -> None:
        self.rq.lrem(self.queue.keys.rq_taken(name), 1, job_id)

    def hook(self, step: str) -> None:
        if self.pause is not None and self.pause[0] == step:
            log.info("rq.paused step=%s seconds=%g", step, self.pause[1])
            time.sleep(self.pause[1])
