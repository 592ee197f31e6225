"""Names a user gives: handlers, models, tenants, task and worker ids. Key names, hash tags,
comma-separated lists, log lines and terminals carry them, so a name is 1..200 printable
characters, at most 200 bytes in UTF-8 (the scripts count bytes), without whitespace, braces
(the hash tag) or commas (the lists); a control character would reach keys and logs as it
is. enqueue.lua and tenant.lua check the same for producers that bypass this client.
"""

from __future__ import annotations

import re

from gpuq.redact import clipped

MAX_NAME_LEN = 200
BAD_NAME = re.compile(r"[{},\s]")


def name_problem(value: str) -> str | None:
    """What is wrong with a non-empty name, as the rest of its error line (the quoted name
    first), or None."""
    if len(value) > MAX_NAME_LEN:
        return f"{clipped(value)} is longer than {MAX_NAME_LEN} characters"
    if len(value.encode("utf-8", "replace")) > MAX_NAME_LEN:  # as enqueue.lua counts: bytes
        return f"{clipped(value)} is longer than {MAX_NAME_LEN} bytes in UTF-8"
    if not value.isprintable() or BAD_NAME.search(value):
        return f"{value!r} holds spaces, commas, braces or control characters"
    return None
