"""The HTTP endpoint that serves a registry at ``/metrics`` (a worker's, the exporter's).

A scrape whose collector fails (Redis away, a pool figure that will not read) answers 503
and logs one line, ``<what>.scrape_failed``: the default server would print a multi-line
traceback to stderr, which breaks the one-object-per-line logs shippers read, and
Prometheus marks the target down either way.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from gpuq.errors import ConfigError
from gpuq.redact import one_line, redact

log = logging.getLogger("gpuq.metrics")

App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        """No access log: Prometheus scrapes every few seconds."""


def guarded(app: App, what: str) -> App:
    """``app``, answering 503 with one log line where it would raise."""
    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        try:
            return app(environ, start_response)
        except Exception as exc:
            reason = one_line(redact(f"{type(exc).__name__}: {exc}"))
            log.error("%s.scrape_failed error=%s", what, reason)
            start_response("503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")],
                           sys.exc_info())
            return [f"scrape failed: {reason}\n".encode()]
    return serve


def serve_http(registry: CollectorRegistry, host: str, port: int, what: str) -> None:
    """Serve ``registry`` on http://host:port/metrics from a daemon thread; a port taken or an
    address not on this host is one ConfigError line, not a traceback."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
        app = guarded(make_wsgi_app(registry), what)
        httpd: ThreadingWSGIServer = make_server(host, port, app, server_class, handler_class=_Quiet)
    except OSError as exc:
        raise ConfigError(f"{what} port {host}:{port}: {exc.strerror or exc}") from None
    threading.Thread(target=httpd.serve_forever, name=f"{what}-http", daemon=True).start()
