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


def test_json_fields_hold_a_whole_argument_spaces_and_all(capsys: pytest.CaptureFixture[str]) -> None:
    """Found by an integrator: ``reason=enough workers`` came out as ``"reason": "enough"``,
    an error as its first word: a pipeline filtering on the field got the wrong value."""
    logs.configure("INFO", "json")
    try:
        log = logging.getLogger("gpuq.test")
        log.info("scale.signal pool=%s class=%s current=%d desired=%d reason=%s%s", "p", "A100", 1, 1,
                 "enough workers", "")
        log.warning("redis.unavailable %s error=%s: retrying with backoff up to %g s", "worker=w",
                    "Error 111 connecting to redis://:secret@h:1. Connection refused.", 2.0)
        log.info("model.load_failed worker=%s model=%s error=%s failures=%d", "w", "m",
                 "OSError: no space left", 2)
    finally:
        logs.configure("INFO", "text")
    first, second, third = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert (first["reason"], first["desired"]) == ("enough workers", "1")
    assert second["error"] == "Error 111 connecting to redis://:***@h:1. Connection refused."
    assert "secret" not in json.dumps(second)
    assert (third["error"], third["failures"]) == ("OSError: no space left", "2")


def test_text_format_is_the_default_layout(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("INFO", "text")
    logging.getLogger("gpuq.test").info("task.claimed task=t-2")
    err = capsys.readouterr().err
    assert " INFO gpuq.test task.claimed task=t-2" in err


def test_passwords_are_masked_in_every_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Message text, %-arguments and tracebacks, in both formats."""
    url = "redis://gpuq-worker:s3cret@10.0.0.5:6379/0"
    for fmt in ("text", "json"):
        logs.configure("INFO", fmt)
        try:
            log = logging.getLogger("gpuq.test")
            log.info("worker.connecting url=%s", url)
            log.warning(f"worker.redis_error error=cannot reach {url}")
            log.info("sentinel url=%s", "redis+sentinel://h:1/m?sentinel_password=s3cret")
            try:
                raise RuntimeError(f"boom at {url}")
            except RuntimeError:
                log.exception("worker.runner_error worker=%s", "w-1")
        finally:
            logs.configure("INFO", "text")
        err = capsys.readouterr().err
        assert "s3cret" not in err, err
        assert err.count("redis://gpuq-worker:***@10.0.0.5:6379/0") >= 3, err  # json repeats fields
        assert "sentinel_password=***" in err and "RuntimeError: boom at" in err
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "plain %s", ("text",), None)
    assert logs.Redact().filter(record) and record.getMessage() == "plain text" and record.args


def test_debug_is_gpuqs_own_and_the_redis_client_stays_at_info(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The defect: redis-py 8.2 logs each failed read at DEBUG, so a refused login printed
    a second line before gpuq's one-line error."""
    logs.configure("DEBUG", "text")
    try:
        logging.getLogger("gpuq.test").debug("task.claimed task=t-3")
        logging.getLogger("redis.connection").debug("AuthenticationError while reading response")
        logging.getLogger("redis.connection").warning("a client warning still shows")
    finally:
        logs.configure("INFO", "text")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "task.claimed task=t-3" in lines[0]
    assert "a client warning still shows" in lines[1]
    logs.configure("ERROR", "text")
    try:
        assert logging.getLogger("redis").getEffectiveLevel() == logging.ERROR
    finally:
        logs.configure("INFO", "text")
