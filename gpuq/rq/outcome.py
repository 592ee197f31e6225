"""Job status and results written back in RQ's own format, through RQ's own API.

The producer's ``job.get_status()``, ``job.return_value()`` / ``job.latest_result(timeout=...)``
and RQ's registries then read as if an RQ worker had run the job: a Result record (successful,
or failed with the exception text), status ``finished`` / ``failed``, the job in the finished
or failed registry, and its dependents enqueued. A running job shows status ``started`` but is
not put in RQ's StartedJobRegistry: RQ workers sweep that registry and would fail a job whose
RQ heartbeat stops, while gpuq's own lease decides whether a task is alive.
"""

from __future__ import annotations

import logging
from typing import Any

from rq.defaults import DEFAULT_RESULT_TTL
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.utils import now

log = logging.getLogger(__name__)


def started(job: Job, worker_name: str) -> None:
    with job.connection.pipeline() as pipe:
        job.prepare_for_execution(worker_name, pipeline=pipe)  # status, started_at, worker_name
        pipe.execute()


def queued_again(job: Job) -> None:
    """A run given back (a yield, a lost run): the job waits again."""
    job.set_status(JobStatus.QUEUED)


def retrying(job: Job) -> None:
    """A failed attempt that gpuq will retry: the job waits again with a retry spent, as RQ
    shows its own (``retries_left``, where the job has a Retry)."""
    with job.connection.pipeline() as pipe:
        job.set_status(JobStatus.QUEUED, pipeline=pipe)
        if job.retries_left:
            job.retries_left -= 1
            pipe.hset(job.key, "retries_left", job.retries_left)
        pipe.execute()


def finished(job: Job, value: Any, worker_name: str) -> None:
    job._result = value
    job.ended_at = now()
    result_ttl = job.get_result_ttl(DEFAULT_RESULT_TTL)
    with job.connection.pipeline() as pipe:
        if result_ttl != 0:  # as RQ's worker: a result_ttl of 0 keeps no result
            job._handle_success(result_ttl, pipeline=pipe, worker_name=worker_name)
        else:
            job.set_status(JobStatus.FINISHED, pipeline=pipe)
        pipe.execute()
    _dependents(job)  # before the cleanup: a result_ttl of 0 deletes the job's dependents
    with job.connection.pipeline() as pipe:
        job.cleanup(result_ttl, pipeline=pipe, remove_from_queue=False)
        pipe.execute()


def failed(job: Job, exc_string: str, worker_name: str = "") -> None:
    job.ended_at = now()
    with job.connection.pipeline() as pipe:
        job.set_status(JobStatus.FAILED, pipeline=pipe)
        job._handle_failure(exc_string, pipeline=pipe, worker_name=worker_name)  # registry + Result
        pipe.execute()
    _dependents(job)


def _dependents(job: Job) -> None:
    """Jobs waiting on this one go to their queues, as after an RQ worker's run (RQ itself
    decides which: a failure releases only dependents that allow failure)."""
    try:
        Queue(job.origin, connection=job.connection, serializer=job.serializer).enqueue_dependents(job)
    except Exception as exc:  # the job's own outcome is written; say what was not
        log.error("rq.dependents_failed job=%s error=%s", job.id, exc)
