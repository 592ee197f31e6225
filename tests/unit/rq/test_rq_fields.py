"""gpuq.rq.fields: GPU fields from meta["gpuq"] over the bridge's defaults; clear refusals."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from gpuq.rq.fields import JobRefused, task_id_for, task_options, task_spec
from gpuq.task import Priority

AT = datetime(2024, 5, 1, 12, 0, 0, 250000, tzinfo=UTC)


def spec(meta: object, defaults: dict[str, object] | None = None, retries_left: int | None = None):  # type: ignore[no-untyped-def]
    return task_spec("j1", "gpu", AT, meta, defaults or {}, retries_left)


def test_meta_fields_make_the_task() -> None:
    s = spec({"gpuq": {"model": "llama3-8b", "vram_gb": 16, "priority": "online", "est_s": 0.4,
                       "deadline_s": 5, "preemptible": False, "tenant": "search"}})
    assert (s.handler, s.model, s.vram_gb, s.priority, s.est_s, s.deadline_s, s.preemptible,
            s.tenant) == ("rq.job", "llama3-8b", 16.0, Priority.P0, 0.4, 5.0, False, "search")
    assert json.loads(s.payload) == {"rq_job": "j1", "rq_queue": "gpu"}
    assert s.task_id == task_id_for("j1", AT) == f"rq-j1-{int(AT.timestamp() * 1000)}"


def test_meta_overrides_defaults_and_defaults_fill_the_rest() -> None:
    s = spec({"gpuq": {"vram_gb": 20}}, {"model": "m", "vram_gb": 10, "priority": Priority.P1})
    assert (s.model, s.vram_gb, s.priority) == ("m", 20.0, Priority.P1)
    assert spec({"other": 1}, {"model": "m", "vram_gb": 10}).vram_gb == 10.0


def test_attempts_follow_rq_retry_unless_given() -> None:
    base = {"model": "m", "vram_gb": 10}
    assert spec({}, base).max_attempts == 1  # RQ runs a job without Retry once
    assert spec({}, base, retries_left=2).max_attempts == 3
    assert spec({"gpuq": {"max_attempts": 5}}, base, retries_left=2).max_attempts == 5
    assert spec({}, {**base, "max_attempts": 4}).max_attempts == 4


def test_the_task_id_changes_when_rq_enqueues_the_job_again() -> None:
    later = AT.replace(second=1)
    assert task_id_for("j1", AT) == task_id_for("j1", AT)
    assert task_id_for("j1", AT) != task_id_for("j1", later)
    odd = task_id_for("a job {with} spaces", AT)
    assert odd.startswith("rq-") and " " not in odd and "{" not in odd


@pytest.mark.parametrize(("meta", "defaults", "reason"), [
    ({}, {}, "no model or vram_gb"),
    ({"gpuq": {"model": "m"}}, {}, "no vram_gb"),
    ({"gpuq": {"model": "m", "vram_gb": -4}}, {},
     "vram_gb must be a finite number > 0 and at most 1e6, got -4"),
    ({"gpuq": {"model": "m", "vram_gb": 8, "priority": "urgent"}}, {}, "unknown priority 'urgent'"),
    ({"gpuq": {"model": "m", "vram_gb": "8"}}, {}, "vram_gb must be a number"),
    ({"gpuq": {"model": "m", "vram_gb": 8, "gpus": 2}}, {}, "unknown field(s) gpus"),
    ({"gpuq": ["m", 8]}, {}, "must be a dict"),
    ({"gpuq": {"model": "has space", "vram_gb": 8}}, {}, "spaces"),
    ({"unserialized": b"\x80..."}, {"model": "m", "vram_gb": 8}, "not plain data"),
])
def test_bad_fields_are_refused_with_one_clear_line(meta: object, defaults: dict[str, object],
                                                    reason: str) -> None:
    with pytest.raises(JobRefused) as caught:
        spec(meta, defaults)
    message = str(caught.value)
    assert reason in message and message.startswith("rq job j1 refused by gpuq: ")
    assert "\n" not in message


def test_options_ignore_unset_defaults() -> None:
    options = task_options("j", {"gpuq": {"model": "m", "vram_gb": 1}}, {"tenant": None}, None)
    assert "tenant" not in options
