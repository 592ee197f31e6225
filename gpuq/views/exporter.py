"""``gpuq exporter``: pool-level Prometheus metrics, read from Redis on every scrape.

Stateless: the figures live in Redis (queues, the ``stats`` counters the scripts keep, the
model catalog, worker hashes, the reaper's scale signals), so several exporters, or one that
restarts, report the same values and no worker restart resets a counter. Per-GPU metrics come
from the workers themselves (``gpuq worker --metrics-port``), so nothing is counted twice.
"""

from __future__ import annotations

import logging
import signal
import threading

import redis
from prometheus_client import CollectorRegistry

from gpuq.keys import Keys
from gpuq.metrics import PoolCollector, PoolFigures, serve_http
from gpuq.views.inspect import pool_view

log = logging.getLogger(__name__)


def read_figures(client: redis.Redis, keys: Keys) -> PoolFigures:
    view = pool_view(client, keys)
    workers: dict[tuple[str, str], int] = {}
    for w in view.workers:
        key = (w.gpu, w.state if w.alive else "dead")
        workers[key] = workers.get(key, 0) + 1
    desired, forecast = [], []
    for field_name, signal_value in view.scale.items():
        kind, _, name = field_name.partition(":")
        if kind in ("class", "model") and "desired" in signal_value:
            desired.append((kind, name, int(signal_value.get("current", 0)),
                            int(signal_value["desired"])))
            if "forecast_per_s" in signal_value:
                forecast.append((kind, name, float(signal_value.get("rate_per_s", 0.0)),
                                 float(signal_value["forecast_per_s"])))
    return PoolFigures(
        pool=view.pool,
        queues=[(q.priority, q.model, q.depth, q.oldest_wait_s) for q in view.queues],
        running=view.running, delayed=view.delayed, unschedulable=view.unschedulable,
        stats=view.stats,
        model_loads=[(m["name"], int(m["loads"]), float(m["mean_load_s"]) * int(m["loads"]))
                     for m in view.models],
        workers=workers, desired=desired, forecast=forecast,
        reaper_active=bool(client.exists(keys.reaper_lock)), tenants=view.tenants)


class Exporter:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(PoolCollector(lambda: read_figures(client, keys)))
        self.keys = keys
        self.stopped = threading.Event()

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve /metrics until SIGTERM or SIGINT; exits 0."""
        serve_http(self.registry, host, port, "exporter")
        log.info("exporter.started pool=%s host=%s port=%d", self.keys.pool, host, port)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stopped.set())
            signal.signal(signal.SIGINT, lambda *_: self.stopped.set())
        self.stopped.wait()
        log.info("exporter.stopped pool=%s", self.keys.pool)
        return 0
