"""Where rq is needed: one clear error when the extra is missing, and RQ's own client."""

from __future__ import annotations

import re
from collections.abc import Iterable

import redis

from gpuq.app import App
from gpuq.client import Queue
from gpuq.connection import connect, redis_errors
from gpuq.errors import AppError, ConfigError, GpuqError
from gpuq.tls import Tls


def require() -> None:
    """ConfigError (one line, non-zero exit in the CLI) when rq is not installed."""
    try:
        import rq
    except ImportError:
        raise ConfigError("RQ interop needs the rq extra: pip install 'gpuq[rq]' (rq>=2,<3)") from None
    version = str(getattr(rq, "__version__", "0"))
    if not version.startswith("2."):  # written and tested against RQ 2.x's Job, Result and registries
        raise ConfigError(f"RQ interop supports rq 2.x, found rq {version}: pip install 'gpuq[rq]'")


def rq_client(url: str, tls: Tls | None = None) -> redis.Redis:
    """A client for RQ's Redis: RQ reads bytes (no decode_responses), and blocking pops set
    their own timeouts. The TLS files apply when its URL is a TLS one (it may be a plain
    one while gpuq's is not)."""
    secure = url.lower().startswith("rediss")
    return connect(url, tls=tls if secure else None, decode_responses=False)


MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def module_names(given: object, where: str, error: type[GpuqError]) -> list[str]:
    """The module names of an allowlist setting, each checked (``error``, one line, for a
    value that is not a list of dotted names: a bare string, a pattern, a path)."""
    if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
        raise error(f"{where} must be a list of module names such as myapp.jobs, got {given!r}")
    names = []
    for name in given:
        if not isinstance(name, str) or not MODULE.fullmatch(name.strip()):
            raise error(f"{where}: {name!r} is not a module name (dotted, e.g. myapp.jobs; no patterns)")
        names.append(name.strip())
    return names


def enable_worker(app: App, extra_allow: Iterable[str], rq_url: str, queue: Queue) -> None:
    """Register the rq handler when the app's ``rq_allow`` or ``--rq-allow`` names modules."""
    from gpuq.rq.unpickle import Allowlist

    allow = Allowlist([*module_names(app.rq_allow, f"app {app.name!r}: rq_allow", AppError),
                       *module_names(extra_allow, "--rq-allow", ConfigError)])
    if not allow:
        return
    require()
    from gpuq.rq.handler import install

    rq_redis = rq_client(rq_url, Tls.of(queue.config))
    with redis_errors(rq_url):  # at start, as the bridge does: not as every job's failure
        rq_redis.ping()
    install(app, allow, rq_redis, queue.redis, queue.keys)
