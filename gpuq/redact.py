"""Text made safe to show: credentials masked out of URLs in errors, log lines and reports;
control characters escaped where users' names are printed (``one_line``).

``redact`` works on free text, not on one parsed URL, so it also covers a URL that does not
parse, one embedded in a longer message, and a Sentinel or Cluster URL listing several hosts
(which ``urllib`` cannot split).
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

MASK = "***"
# scheme://user:password@ -- the password runs to the last "@" before whitespace, so an
# unencoded "@" or "/" in it is masked too (at worst a little more than the password is)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@]*:)[^\s]*@")
# ?password=... and ?sentinel_password=... query parameters, their names percent-encoded or not
# (the URL parsers decode them: ?%70assword= logs in): the value runs to the quote that ends a
# shown URL, and to a colon before whitespace, where a message goes on ("...=***: why"), so
# redacting a redacted message keeps its colon
_QUERY = re.compile(r"([?&][^=&\s#'\"]*=)((?:(?!:\s)[^&\s#'\"])*)")


def redact(text: str) -> str:
    """``text`` with every URL password replaced by ***: ``redis://user:***@host:6379/0``.
    A bare ``redis://name@host`` is a user name in URL terms and stays."""
    return _QUERY.sub(_masked_value, _USERINFO.sub(rf"\g<1>{MASK}@", text))


def _masked_value(m: re.Match[str]) -> str:
    """A query parameter, its value masked if its name (decoded) names a password."""
    return m.group(1) + MASK if unquote_plus(m.group(1)[1:-1]).lower().endswith("password") else m.group()


# one whole URL: its password runs to the URL's last "@", spaces included (an unencoded space
# in a password still reaches the server, and redact's free-text rule stops at whitespace)
_WHOLE_USERINFO = re.compile(r"(?is)^(\s*[a-z][a-z0-9+.-]*://[^:/@]*:).*@")
_WHOLE_QUERY = re.compile(r"([?&][^=&#]*=)([^&#]*)")


def redact_url(url: str) -> str:
    """``url``, one URL as given (``--redis``, ``GPUQ_REDIS_URL``), with its password masked
    wherever it ends: ``redact`` for a string that is known to be one URL."""
    return _WHOLE_QUERY.sub(_masked_value, _WHOLE_USERINFO.sub(rf"\g<1>{MASK}@", url))


def one_line(message: str) -> str:
    """A message that names user input stays one line and sends no terminal escape: control
    characters escaped (a task's model or handler, a worker's GPU name, a tenant may hold
    any of them but whitespace)."""
    return re.sub(r"[\x00-\x1f\x7f\x85\u2028\u2029]", lambda m: repr(m.group())[1:-1], message)


def clipped(name: str, most: int = 40) -> str:
    """A user's name as an error shows it: quoted, its first ``most`` characters (a name
    refused as too long stays a short line)."""
    return repr(name) if len(name) <= most else f"{name[:most]!r}... ({len(name)} characters)"
