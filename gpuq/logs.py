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
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


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
        for key, value in FIELD.findall(message):
            out.setdefault(key, value)
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
