"""How a server's or a Sentinel's refusal reads: the gpuq error for each refusal that no
retry of the same command gets past, or that passes only once the server's state changes;
``denied`` tells the long-lived processes which of them to give up on (this user may not)."""

from __future__ import annotations

import re

import redis
import redis.asyncio.sentinel
import redis.sentinel

from gpuq.errors import (
    AuthenticationFailed,
    ConfigError,
    GpuqError,
    NoMaster,
    PermissionDenied,
    ServerRefused,
    TlsFailed,
)
from gpuq.redact import redact_url

_DENIED = ("NOPERM", "can't run this command", "no permissions")
# what redis-py >= 8.2 collects into MasterNotFoundError from a Sentinel that refused the login,
# or whose certificate failed the check (the text is all that is kept of either)
_SENTINEL_LOGIN = re.compile(r"\)> - (?:\w+:)?AuthenticationError: (.*?)(?:, <|$)")
_SENTINEL_TLS = re.compile(r"\[SSL: \w+\] (.*?)(?: \(_ssl\.c:\d+\))?\.?(?:, <|$)")


def first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def denied(exc: redis.RedisError) -> bool:
    """Whether the server refused this user the command (ACL, credentials): no retry will
    get past it, unlike an outage, a failover's read-only replica or a full memory."""
    if isinstance(exc, (redis.AuthenticationError, redis.exceptions.NoPermissionError,
                        redis.exceptions.AuthorizationError)):
        return True
    if isinstance(exc, (redis.sentinel.MasterNotFoundError, redis.asyncio.sentinel.MasterNotFoundError)):
        return isinstance(sentinel_refusal("", exc), (PermissionDenied, AuthenticationFailed))
    return isinstance(exc, redis.ResponseError) and isinstance(refusal("", exc), PermissionDenied)


def sentinel_refusal(url: str, exc: BaseException) -> GpuqError | None:
    """The refusal a Sentinel answered with, as MasterNotFoundError carries it: a plain Redis's
    of SENTINEL, or the ACL's ("<client> - NoPermissionError: this user has no permissions
    ..."); None for other failures."""
    text = str(exc)
    if _refuses_sentinel(text):
        return _not_a_sentinel(url)
    if any(sign in text for sign in _DENIED):
        return PermissionDenied(url, first_line(exc).rpartition("NoPermissionError: ")[2])
    if login := _SENTINEL_LOGIN.search(text):  # the Sentinels' own password or user name
        return AuthenticationFailed(url, f"a Sentinel refused the login (sentinel_password, "
                                         f"sentinel_username in the URL's query): {login[1]}")
    if tls := _SENTINEL_TLS.search(text):
        return TlsFailed(url, f"with a Sentinel: {tls[1].lower().replace('_', ' ')}")
    return None


# refusals that pass once the server's state changes (ServerRefused: an outage to the
# long-lived processes): the sign in the error text, and what to say
_REFUSED = tuple((re.compile(sign), why) for sign, why in (
    ("OOM command not allowed|^OOM ", "it is out of memory (used memory > maxmemory): free memory or "
                                      "raise maxmemory"),
    # a failed background save: the server takes no writes until one works
    ("MISCONF", "it cannot save to disk (MISCONF): fix its `dir` or disk (its log says why), or set "
                "stop-writes-on-bgsave-error no"),
    (r"^BUSY\b| BUSY ", "it is busy running a long script (BUSY): wait for it, or end it with SCRIPT KILL "
                     "or FUNCTION KILL"),  # a script past busy-reply-threshold
    # min-replicas-to-write: the old master of a planned failover, or a replica down
    ("NOREPLICAS", "it has fewer replicas in reach than min-replicas-to-write asks (NOREPLICAS): a "
                   "failover may be under way"),
    ("MASTERDOWN|^LOADING", "it cannot answer yet: a replica that lost its master (MASTERDOWN), or a "
                            "server loading its data (LOADING)"),
    # a pool key another client wrote with another type (a role may write its pool's keys)
    ("WRONGTYPE", "a key of the pool holds another type of value than gpuq writes (WRONGTYPE): "
                  "something else wrote it; find it with redis-cli TYPE on the pool's keys")))


def refusal(url: str, exc: redis.ResponseError) -> GpuqError | None:
    """The gpuq error for a server's refusal that no retry or other command would get
    past; None for the errors callers handle themselves (BUSYGROUP ...)."""
    text, line = str(exc), first_line(exc)
    # inside a script the refusal comes back wrapped: "ERR The user executing the script
    # can't run this command" (an ACL refusal, Redis 7.0), "... NOPERM ...", "... OOM ..."
    if any(sign in text for sign in _DENIED):
        return PermissionDenied(url, line)
    if isinstance(exc, redis.exceptions.ReadOnlyError) or "read only replica" in text:
        return ServerRefused(url, "it is a read-only replica: point the URL (--redis) at the master")
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        text = "OOM " + text
    if why := next((why for sign, why in _REFUSED if sign.search(text)), None):
        return ServerRefused(url, why)
    if "DB index is out of range" in text:  # SELECT of the URL's database
        return ConfigError(f"Redis URL {redact_url(url)!r} names a database the server does not have "
                           f"({line}; the server's `databases` setting, 16 by default, bounds it)")
    if _refuses_sentinel(text):
        return _not_a_sentinel(url)
    if unknown := re.search(r"unknown command [`']([^`']+)[`']", text):  # a Sentinel's port, a proxy
        return ConfigError(f"Redis at {redact_url(url)} does not know the command {unknown[1]}: is it a "
                           "Redis server (6.2 or later)? A Sentinel's address goes in a "
                           "redis+sentinel:// URL")
    return None


def _refuses_sentinel(text: str) -> bool:
    return re.search(r"unknown command [`']sentinel[`']", text, re.IGNORECASE) is not None


def _not_a_sentinel(url: str) -> NoMaster:
    return NoMaster(url, "it is a plain Redis, not a Sentinel (unknown command SENTINEL): use "
                         "redis:// for it, or give redis+sentinel:// the Sentinels' addresses")
