"""Logging set-up for the CLI: plain text, or one JSON object per line (``--log-format json``).

Log lines in gpuq start with a stable event name (``task.claimed``, ``preempt.stopped``) and
carry ``key=value`` fields; the JSON form lifts both out so log pipelines can filter on them
without parsing text. The library itself adds no handlers.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

EVENT = re.compile(r"^([a-z_]+(?:\.[a-z_]+)+)\b")
FIELD = re.compile(r"\b([a-z_]+)=(\S+?)[:,;]?(?=\s|$)")  # a value ends before ": reason"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


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
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure(level: str, fmt: str) -> None:
    """Log to stderr at ``level`` in ``fmt`` ("text" or "json")."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
