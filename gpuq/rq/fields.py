"""From an RQ job to a gpuq task: GPU fields, a deterministic task id, a JSON payload.

GPU fields come from the job's ``meta["gpuq"]`` over the bridge's defaults. The task id is
derived from the RQ job id and its ``enqueued_at`` (RQ sets that on every enqueue, a requeue
from the failed registry included), so the bridge re-running a half-done move enqueues
nothing twice, while a job RQ enqueued again runs again.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gpuq.errors import GpuqError, InvalidTask
from gpuq.names import MAX_NAME_LEN
from gpuq.task import TaskSpec

HANDLER = "rq.job"  # the gpuq handler name of every task made from an RQ job
GPU_FIELDS = ("model", "vram_gb", "priority", "est_s", "deadline_s", "preemptible", "tenant",
              "max_attempts")
_PLAIN_ID = re.compile(r"[A-Za-z0-9_.:-]+")


class JobRefused(GpuqError):
    """An RQ job gpuq will not run; the bridge or the worker marks it failed in RQ."""

    def __init__(self, job_id: str, reason: str) -> None:
        self.job_id = job_id
        self.reason = reason
        super().__init__(f"rq job {job_id} refused by gpuq: {reason}")


def task_id_for(job_id: str, enqueued_at: datetime | None) -> str:
    stamp = int(enqueued_at.timestamp() * 1000) if enqueued_at is not None else 0
    task_id = f"rq-{job_id}-{stamp}"
    if len(task_id) <= MAX_NAME_LEN and _PLAIN_ID.fullmatch(job_id):
        return task_id
    return "rq-" + hashlib.sha256(task_id.encode()).hexdigest()[:32]  # odd RQ ids stay valid names


def task_options(job_id: str, meta: Any, defaults: Mapping[str, Any],
                 retries_left: int | None) -> dict[str, Any]:
    """meta["gpuq"] over the defaults; max_attempts falls back to RQ's Retry (max + 1) or 1,
    as RQ runs a job without Retry once."""
    if isinstance(meta, dict) and set(meta) == {"unserialized"}:  # RQ's mark of a meta it could not read
        raise JobRefused(job_id, "meta is not plain data (it names a class the bridge does not load)")
    given = meta.get("gpuq") if isinstance(meta, dict) else None
    given = {} if given is None else given
    if not isinstance(given, dict):
        raise JobRefused(job_id, f"meta['gpuq'] must be a dict, got {type(given).__name__}")
    unknown = sorted(str(k) for k in given if k not in GPU_FIELDS)
    if unknown:
        raise JobRefused(job_id, f"meta['gpuq'] has unknown field(s) {', '.join(unknown)} "
                                 f"(known: {', '.join(GPU_FIELDS)})")
    options = {k: v for k, v in defaults.items() if v is not None}
    options.update({k: v for k, v in given.items() if v is not None})
    missing = [f for f in ("model", "vram_gb") if f not in options]
    if missing:
        raise JobRefused(job_id, f"no {' or '.join(missing)}: set meta={{'gpuq': {{...}}}} on the "
                                 f"job or give the bridge --{missing[0].replace('_', '-')}")
    options.setdefault("max_attempts", 1 + (retries_left or 0))
    return options


def check_defaults(defaults: Mapping[str, Any]) -> None:
    """The bridge's defaults, checked once at its start (InvalidTask): a bad one would have it
    take every job and mark each failed in RQ."""
    options = {"model": "m", "vram_gb": 1, **{k: v for k, v in defaults.items() if v is not None}}
    TaskSpec.build(HANDLER, {}, **options)


def task_spec(job_id: str, rq_queue: str, enqueued_at: datetime | None, meta: Any,
              defaults: Mapping[str, Any], retries_left: int | None = None) -> TaskSpec:
    """The gpuq task for one RQ job; JobRefused (with the validation's reason) if invalid."""
    options = task_options(job_id, meta, defaults, retries_left)
    try:
        return TaskSpec.build(HANDLER, {"rq_job": job_id, "rq_queue": rq_queue},
                              task_id=task_id_for(job_id, enqueued_at), report_end=True, **options)
    except InvalidTask as exc:
        raise JobRefused(job_id, exc.reason) from None
    except TypeError as exc:  # e.g. a field of the wrong kind TaskSpec.build cannot take
        raise JobRefused(job_id, str(exc)) from None
