"""Credentials masked out of any text: URLs in errors, log lines and reports.

``redact`` works on free text, not on one parsed URL, so it also covers a URL that does not
parse, one embedded in a longer message, and a Sentinel or Cluster URL listing several hosts
(which ``urllib`` cannot split).
"""

from __future__ import annotations

import re

MASK = "***"
# scheme://user:password@ -- the password runs to the last "@" before whitespace, so an
# unencoded "@" or "/" in it is masked too (at worst a little more than the password is)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@]*:)[^\s]*@")
# ?password=... and ?sentinel_password=... query parameters
_QUERY = re.compile(r"(?i)([?&][a-z_]*password=)[^&\s#]*")


def redact(text: str) -> str:
    """``text`` with every URL password replaced by ***: ``redis://user:***@host:6379/0``.
    A bare ``redis://name@host`` is a user name in URL terms and stays."""
    return _QUERY.sub(rf"\g<1>{MASK}", _USERINFO.sub(rf"\g<1>{MASK}@", text))
