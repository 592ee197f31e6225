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
from typing import Any

import redis
from prometheus_client import CollectorRegistry

from gpuq.keys import Keys
from gpuq.metrics import PoolCollector, PoolFigures
from gpuq.metrics_http import serve_http
from gpuq.views.inspect import OTHER, number, pool_view, scale_stale, scale_stale_after_s

log = logging.getLogger(__name__)


class TopLoads:
    """The models the load counters show as series of their own, at most ``keep``, the rest
    summed as ``other``. Sticky for the exporter's life: a model shown stays shown while the
    catalog lists it, so a model rising into the top does not take its count out of
    ``other`` (a counter that falls reads as a reset: ``rate()`` would count it again). A
    model named ``other`` always joins the summed row, and a model of that row whose entry
    leaves the catalog (unused for its TTL: gpuq.catalog) stays counted in it."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.shown: list[str] = []
        self.summed: dict[str, tuple[int, float]] = {}  # the last scrape's ``other`` models
        self.gone = (0, 0.0)  # loads and seconds of those that left the catalog since

    def __call__(self, loads: list[tuple[str, int, float]]) -> list[tuple[str, int, float]]:
        by_name = {m[0]: m for m in loads}
        for name in set(self.summed) - set(by_name):
            n, seconds = self.summed.pop(name)
            self.gone = (self.gone[0] + n, self.gone[1] + seconds)
        self.shown = [name for name in self.shown if name in by_name]
        for name, _, _ in sorted(loads, key=lambda m: (-m[1], m[0])):
            if len(self.shown) >= self.keep:
                break
            # a slot a model shown left is for a model new to the exporter, not one of other's
            if name not in self.shown and name != OTHER and name not in self.summed:
                self.shown.append(name)
        shown = set(self.shown)
        rest = [m for m in loads if m[0] not in shown]
        self.summed = {m[0]: (m[1], m[2]) for m in rest}
        rows = sorted((by_name[name] for name in self.shown), key=lambda m: (-m[1], m[0]))
        if rest or self.gone[0]:
            rows.append((OTHER, self.gone[0] + sum(m[1] for m in rest),
                         self.gone[1] + sum(m[2] for m in rest)))
        return rows


WORKER_STATES = ("idle", "busy", "draining", "silent", "dead")


def read_figures(client: redis.Redis, keys: Keys, keep: int = 50,
                 loads: TopLoads | None = None) -> PoolFigures:
    """The pool's figures for one scrape; per-model series capped at ``keep`` models per
    metric (``Config.exporter_models``); loads: the exporter's models shown in the load
    counters (None: this scrape's most loaded)."""
    view = pool_view(client, keys, top=keep)
    # every state of a class present, 0 too: a series that vanishes breaks alerts on it
    workers = {(w.gpu, s): 0 for w in view.workers for s in WORKER_STATES}
    for w in view.workers:
        key = (w.gpu, w.state if w.alive else "dead")
        workers[key] = workers.get(key, 0) + 1
    desired, forecast = [], []
    # the reaper signals a model only while it has work or workers: the most desired first;
    # a signal whose figures are not numbers (a foreign writer) is left out, not the scrape.
    # Stale ones too (no reaper rewrites them): an autoscaler must not act on them for ever,
    # and no data is what it is told to hold on (deploy/k8s); their age stays exported.
    fresh = {} if scale_stale(view.scale, view.scale_age_s) else view.scale
    signals = sorted((s for field_name, value in fresh.items()
                      if (s := _signal(field_name, value)) is not None),
                     key=lambda s: (-s[3], s[0] + ":" + s[1]))
    models = 0
    for kind, name, current, want, rates in signals:
        if kind == "model":
            models += 1
            if models > keep:
                continue
        desired.append((kind, name, current, want))
        if rates is not None:
            forecast.append((kind, name, *rates))
    return PoolFigures(
        pool=view.pool,
        queues=[(q.priority, q.model, q.depth, q.oldest_wait_s) for q in view.queues],
        running=view.running, delayed=view.delayed, waiting=view.waiting, schedules=view.schedules,
        unschedulable=view.unschedulable, parked=view.parked,
        stats=view.stats,
        model_loads=(loads or TopLoads(keep))([(m["name"], int(m["loads"]),
                                                float(m["mean_load_s"]) * int(m["loads"]))
                                               for m in view.models]),
        workers=workers, desired=desired, forecast=forecast,
        reaper_active=view.reaper_active, scale_age_s=view.scale_age_s,
        scale_stale_after_s=scale_stale_after_s(view.scale),
        tenants=capped_tenants(view.tenants, keep))


def _signal(field_name: str, value: dict[str, Any]
            ) -> tuple[str, str, int, int, tuple[float, float] | None] | None:
    """One scale signal as (kind, name, current, desired, (rate now, forecast) or None);
    None when it is not a class's or model's desired count or a figure is not a number."""
    kind, _, name = field_name.partition(":")
    if kind not in ("class", "model") or "desired" not in value:
        return None
    want, current = number(value["desired"]), number(value.get("current", 0))
    if want is None or current is None:
        return None
    rates = None
    if "forecast_per_s" in value:
        now, ahead = number(value.get("rate_per_s", 0.0)), number(value["forecast_per_s"])
        if now is not None and ahead is not None:
            rates = (now, ahead)
    return kind, name, int(current), int(want), rates


def capped_tenants(tenants: list[dict[str, Any]], keep: int) -> list[dict[str, Any]]:
    """Every registered tenant, and the ``keep`` unregistered ones with the most queued tasks:
    producers name those, so their count has no bound of its own."""
    named = sorted((t for t in tenants if not t.get("registered")),
                   key=lambda t: (-sum(t.get("queued", {}).values()), t["name"]))
    return [t for t in tenants if t.get("registered")] + named[:keep]


class Exporter:
    def __init__(self, client: redis.Redis, keys: Keys, keep_models: int = 50) -> None:
        self.registry = CollectorRegistry()
        loads = TopLoads(keep_models)
        self.registry.register(PoolCollector(lambda: read_figures(client, keys, keep_models, loads)))
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
