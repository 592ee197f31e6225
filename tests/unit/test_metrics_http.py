"""The metrics endpoint (gpuq.metrics_http): a scrape that fails is one log line and a 503."""

from __future__ import annotations

import logging
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuq.metrics_http import serve_http


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Flaky(Collector):
    def __init__(self) -> None:
        self.down = False

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.down:
            raise ConnectionError("Error 111 connecting to 127.0.0.1:1.\nConnection refused.")
        yield GaugeMetricFamily("gpuq_probe", "A probe.", value=1)


def test_a_failed_scrape_is_a_503_and_one_log_line(caplog: pytest.LogCaptureFixture,
                                                   capfd: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the collector's error escaped into the HTTP server, which printed a
    multi-line traceback to stderr on every scrape (Redis away: every 10 s), breaking the
    one-JSON-object-per-line logs."""
    registry, flaky, port = CollectorRegistry(), Flaky(), free_port()
    registry.register(flaky)
    serve_http(registry, "127.0.0.1", port, "exporter")
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as ok:
        assert b"gpuq_probe 1.0" in ok.read()
    flaky.down = True
    logger = logging.getLogger("gpuq.metrics")  # only this test's handler: another test's may
    monkeypatch.setattr(logger, "propagate", False)  # write to a stream closed since
    logger.addHandler(caplog.handler)
    try:
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(url, timeout=5)
    finally:
        logger.removeHandler(caplog.handler)
    assert failed.value.code == 503
    failed.value.close()
    (record,) = [r for r in caplog.records if "scrape_failed" in r.getMessage()]
    assert "\n" not in record.getMessage() and "Connection refused" in record.getMessage()
    assert "Traceback" not in capfd.readouterr().err
