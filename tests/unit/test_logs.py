"""Structured logs: --log-format json gives one object per line with the event and fields."""

from __future__ import annotations

import json
import logging

import pytest

from gpuq import logs


def test_json_lines_lift_the_event_name_and_fields(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("INFO", "json")
    try:
        log = logging.getLogger("gpuq.test")
        log.info("preempt.stopped task=%s worker=%s: past its yield deadline", "t-1", "w-1")
        log.debug("hidden.event a=1")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            log.exception("worker.runner_error worker=%s", "w-1")
        log.warning("no event here, just text")
    finally:
        logs.configure("INFO", "text")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert len(lines) == 3
    first, second, third = lines
    assert first["event"] == "preempt.stopped" and first["level"] == "info"
    assert first["task"] == "t-1" and first["worker"] == "w-1"
    assert first["logger"] == "gpuq.test" and first["ts"].endswith("+00:00")
    assert second["event"] == "worker.runner_error" and "RuntimeError: boom" in second["exc"]
    assert "event" not in third and third["message"] == "no event here, just text"


def test_text_format_is_the_default_layout(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("INFO", "text")
    logging.getLogger("gpuq.test").info("task.claimed task=t-2")
    err = capsys.readouterr().err
    assert " INFO gpuq.test task.claimed task=t-2" in err
