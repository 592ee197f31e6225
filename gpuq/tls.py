"""TLS to Redis: the files a client presents, connections whose handshake the connect timeout
bounds, and why a handshake failed, in words."""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass
from typing import Any

import redis
import redis.sentinel

from gpuq.config import Config
from gpuq.errors import ConfigError


@dataclass(frozen=True)
class Tls:
    """TLS files: the CA that signed the server's certificate, and the client's own
    certificate and key when the server asks for one (``tls-auth-clients yes``)."""

    ca: str = ""
    cert: str = ""
    key: str = ""

    @classmethod
    def of(cls, config: Config) -> Tls:
        return cls(config.tls_ca, config.tls_cert, config.tls_key)

    def __bool__(self) -> bool:
        return bool(self.ca or self.cert or self.key)

    def options(self) -> dict[str, Any]:
        """redis-py's ssl_* arguments, files checked first (a missing file is a
        configuration error, not a failed handshake)."""
        for flag, path in (("--tls-ca", self.ca), ("--tls-cert", self.cert), ("--tls-key", self.key)):
            if path and not os.access(path, os.R_OK):
                raise ConfigError(f"{flag} {path!r}: no such readable file")
        if self.key and not self.cert:
            raise ConfigError("--tls-key needs --tls-cert (the client certificate it belongs to)")
        return {"ssl_ca_certs": self.ca or None, "ssl_certfile": self.cert or None,
                "ssl_keyfile": self.key or None, "ssl_cert_reqs": "required"}


class _BoundedHandshake:
    """For redis-py's TLS connections: the handshake is part of connecting, so it gets the
    connect timeout. redis-py runs it under the read timeout, which gpuq leaves unset (for
    blocking pops), so rediss:// to a plain port would hang forever."""

    socket_timeout: float | None
    socket_connect_timeout: float | None

    def _connect(self) -> socket.socket:
        kept = self.socket_timeout
        self.socket_timeout = self.socket_connect_timeout
        try:
            sock: socket.socket = super()._connect()  # type: ignore[misc]
        finally:
            self.socket_timeout = kept
        sock.settimeout(kept)
        return sock


class TlsConnection(_BoundedHandshake, redis.SSLConnection):
    pass


class SentinelTlsConnection(_BoundedHandshake, redis.sentinel.SentinelManagedSSLConnection):
    pass


class ClosedAfterHandshake(redis.ConnectionError):
    """asyncio's TLS reports a server that refused the client's certificate (or wanted one) as
    a reset on the first read after the handshake, not as a TLS error."""


def cause_of(exc: BaseException) -> str | None:
    """Why a TLS handshake failed, if an ssl error lies under ``exc``."""
    seen: BaseException | None = exc
    for _ in range(5):  # redis-py wraps the ssl error once or twice
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLCertVerificationError):
            detail = getattr(seen, "verify_message", None)  # set by the ssl module's own raise
            return "certificate verify failed" + (f": {detail}" if detail else "")
        if isinstance(seen, (ssl.SSLEOFError, ClosedAfterHandshake)):
            return ("the server closed the connection during or right after the TLS handshake: "
                    "does it want a client certificate it trusts (--tls-cert, --tls-key)?")
        if isinstance(seen, ssl.SSLError) and "PEM lib" in str(seen):  # load_cert_chain's
            return ("the client certificate or key could not be loaded (--tls-cert: a PEM "
                    "certificate; --tls-key: its PEM private key, unencrypted)")
        if isinstance(seen, ssl.SSLError):
            reason = seen.reason or (str(seen).splitlines() or [type(seen).__name__])[0]
            return str(reason).lower().replace("_", " ")
        if isinstance(seen, TimeoutError) and "handshake" in str(seen):
            return "no TLS handshake within the connect timeout (is the port a TLS port?)"
        seen = seen.__cause__ or seen.__context__
    return None
