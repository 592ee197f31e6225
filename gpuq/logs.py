"""Logging set-up for the CLI: plain text, or one JSON object per line (``--log-format json``).

Log lines in gpuq start with a stable event name (``task.claimed``, ``preempt.stopped``) and
carry ``key=value`` fields; the JSON form lifts both out so log pipelines can filter on them
without parsing text. The library itself adds no handlers.

Every line passes ``Redact`` first: a URL's password (``redis://user:pw@host``) is masked in
the message, its arguments and any traceback, whichever module logged it.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

from gpuq.redact import redact

EVENT = re.compile(r"^([a-z_]+(?:\.[a-z_]+)+)\b")
FIELD = re.compile(r"\b([a-z_]+)=(\S+?)[:,;]?(?=\s|$)")  # a value ends before ": reason"
SPEC = re.compile(r"%(?:\(\w+\))?[#0\- +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[diouxXeEfFgGcrsa%]")
KEY_BEFORE = re.compile(r"\b([a-z_]+)=$")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class Redact(logging.Filter):
    """Masks credentials in a record before any formatter sees it (in place, so every
    handler gets the masked record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: logging reports it when formatting
            return True
        masked = redact(message)
        if masked != message:
            record.msg, record.args = _masked_template(record, masked) or (masked, None)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def _masked_template(record: logging.LogRecord, masked: str) -> tuple[str, tuple[Any, ...]] | None:
    """The record's template and arguments, each masked, where they still make the masked
    message (the JSON fields are read from them); None where they do not."""
    msg, args = record.msg, record.args
    if not isinstance(msg, str) or not isinstance(args, tuple):
        return None
    safe = tuple(a if isinstance(a, (int, float)) else redact(str(a)) for a in args)
    try:
        return (redact(msg), safe) if redact(msg) % safe == masked else None
    except (TypeError, ValueError):
        return None


def template_fields(record: logging.LogRecord) -> dict[str, str]:
    """The ``key=%s`` fields of a record's message template, each its whole argument as
    formatted (a reason or an error with spaces in it too), masked: {} where the template
    cannot say (no arguments, named ones, a record Redact rewrote)."""
    msg, args = record.msg, record.args
    if not isinstance(msg, str) or not isinstance(args, tuple) or not args:
        return {}
    out: dict[str, str] = {}
    specs = [m for m in SPEC.finditer(msg) if m.group() != "%%"]
    if len(specs) != len(args) or any("*" in m.group() or "(" in m.group() for m in specs):
        return {}  # malformed, or widths from arguments: the message's own fields serve
    for m, arg in zip(specs, args):
        if key := KEY_BEFORE.search(msg, 0, m.start()):
            try:
                out[key.group(1)] = redact(m.group() % (arg,))
            except (TypeError, ValueError):
                return {}
    return out


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        event = EVENT.match(message)
        if event:
            out["event"] = event.group(1)
        for key, value in [*template_fields(record).items(), *FIELD.findall(message)]:
            out.setdefault(key, value)  # the template's first: it knows where a value ends
        out["message"] = message
        if record.exc_info:  # Redact formatted (and masked) it already
            out["exc"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure(level: str, fmt: str) -> None:
    """Log to stderr at ``level`` in ``fmt`` ("text" or "json")."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(Redact())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # redis-py (8.2 on) logs each failed read at DEBUG: a second line for an error gpuq
    # already reports in one. ``--log-level`` is gpuq's; the client's own stay at INFO or above.
    logging.getLogger("redis").setLevel(max(logging.INFO, root.level))
