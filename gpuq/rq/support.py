"""Where rq is needed: one clear error when the extra is missing, and RQ's own client."""

from __future__ import annotations

from collections.abc import Iterable

import redis

from gpuq.app import App
from gpuq.client import Queue
from gpuq.connection import connect
from gpuq.errors import ConfigError
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


def enable_worker(app: App, extra_allow: Iterable[str], rq_url: str, queue: Queue) -> None:
    """Register the rq handler when the app's ``rq_allow`` or ``--rq-allow`` names modules."""
    from gpuq.rq.unpickle import Allowlist

    allow = Allowlist([*app.rq_allow, *extra_allow])
    if not allow:
        return
    require()
    from gpuq.rq.handler import install

    install(app, allow, rq_client(rq_url, Tls.of(queue.config)), queue.redis, queue.keys)
