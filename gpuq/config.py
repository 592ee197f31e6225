"""Settings of a pool, its workers and its reaper: one frozen dataclass, units in the names.

Each field has a default and may be set through a ``GPUQ_<FIELD>`` environment variable
(e.g. ``GPUQ_LEASE_S=30``) or the matching CLI option; ``validate`` runs at start-up.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from typing import Any

from gpuq.errors import ConfigError, GpuqError
from gpuq.task import Priority

MAX_CONCURRENCY = 4096  # a worker's runner threads


@dataclass(frozen=True)
class Config:
    redis_url: str = ""  # empty: commands that can, start an embedded server
    pool: str = "default"
    prefix: str = "gpuq"
    tls_ca: str = ""  # rediss://: CA file (PEM) the server's certificate is checked against
    tls_cert: str = ""  # client certificate (PEM), for servers with tls-auth-clients
    tls_key: str = ""  # the client certificate's private key (PEM)
    # scheduling
    sla_p0_s: float = 0.2  # start-within targets; a task's queue score is enqueue time + SLA
    sla_p1_s: float = 1.0
    sla_p2_s: float = 300.0
    sla_p3_s: float = 86400.0  # P3 has no SLA; a day keeps it ordered after the others
    fair_every: int = 5  # after this many higher-priority dispatches one lower one goes
    defer_s: float = 2.0  # longest a task is left for a better-placed idle worker (capped at SLA/2)
    holder_wait_s: float = 300.0  # P2/P3: longest a task waits for a busy GPU holding its model
    #                               rather than load it cold elsewhere (capped at SLA/2)
    kv_reserve_gb: float = 5.0  # VRAM kept for KV cache and allocator slack on every GPU
    scan_per_queue: int = 8  # queued tasks examined per (priority, model) queue in one claim
    # leases and retries
    lease_s: float = 30.0  # a running task is reclaimed if its worker misses renewing this long
    heartbeat_s: float = 5.0  # renewal period; must be well under lease_s
    retry_base_s: float = 1.0  # backoff: base * 2^(attempt-1), capped
    retry_max_s: float = 300.0
    result_ttl_s: float = 7 * 86400.0  # how long an ended task stays readable
    # worker
    concurrency: int = 1  # runner threads of a worker, at most MAX_CONCURRENCY
    shutdown_grace_s: float = 30.0  # SIGTERM: finish running tasks for this long, then requeue
    idle_block_s: float = 5.0  # longest an idle worker blocks before looking for due retries
    idle_timeout_s: float = 300.0  # idle this long: unload models, retire above min_workers (0: never)
    priorities: str = "P0,P1,P2,P3"  # levels a worker serves (a dedicated lane: "P0,P1")
    metrics_port: int = 0  # a worker serves its own metrics on this port (0: none)
    metrics_host: str = "127.0.0.1"  # address it listens on ("0.0.0.0": every interface)
    exporter_models: int = 50  # per-model series the exporter keeps per metric (the rest: "other")
    stop_s: float = 5.0  # a task past its yield deadline that will not stop in-process this
    #                      long after being told makes the worker exit (EXIT_STUCK)
    load_backoff_s: float = 30.0  # a model whose load failed is skipped by the worker's claims this
    #                               long (0: not at all), doubled at each failure in a row...
    load_backoff_max_s: float = 600.0  # ...up to this (gpuq.worker.broken)
    # reaper
    reap_interval_s: float = 1.0
    reaper_lock_s: float = 10.0
    max_wait_s: float = 30.0  # a victim expected to end within this is waited for, not interrupted
    grace_s: float = 10.0  # a victim asked to yield has this long before the worker stops it
    preempt_min_runtime_s: float = 1.0  # a task runs at least this long before it may be preempted
    preempt_max: int = 2  # most times one task is preempted
    min_workers: int = 1  # idle workers retire only while more than this many are live
    on_scale: str = ""  # command run with (class, current, desired) when a class's desired count changes
    scale_target_s: float = 60.0  # desired workers would drain a model's backlog within this
    warm_backlog: int = 4  # queued tasks of a model, all holders busy, before an idle worker preloads it
    # tenants (gpuq.reaper.tenant_room): each tenant with recent demand d (workers its work
    # keeps busy) keeps room for d + tenant_headroom x sqrt(d), up to its share; others borrow the rest
    tenant_headroom: float = 1.0  # 0: no room kept (weights alone)
    tenant_half_life_s: float = 60.0  # a tenant's demand falls toward what it has with this half-life
    # durability: enqueue, ack, fail and requeue send WAIT replica_acks replica_wait_ms after the
    # script (same round trip); an enqueue fewer replicas took in time raises ReplicaTimeout
    replica_acks: int = 0  # 0: no WAIT (a failover may lose the last acknowledged writes)
    replica_wait_ms: int = 1000  # must be > 0 with replica_acks (WAIT 0 would block forever)
    # scaling ahead of demand (gpuq.reaper.forecast): arrivals per model forecast one model
    # load time (plus forecast_lead_s) ahead raise the desired workers before a rise
    scale_signal: str = "forecast"  # "forecast" or "reactive" (backlog and misses only)
    forecast_utilisation: float = 0.7  # workers a forecast asks for keep busy this share of the time
    forecast_window_s: float = 1800.0  # recent arrivals the level and trend read
    forecast_half_life_s: float = 300.0  # the level's decay
    forecast_day_s: float = 86400.0  # the daily season (a week is 7 of them; 0: no seasons)
    forecast_lead_s: float = 0.0  # added to the horizon: how long a new worker takes to come up
    forecast_margin: float = 1.5  # workers of forecast load left to the live ones before more are asked for
    # streamed results (gpuq.stream): a task's stream keeps about this many newest entries, and
    # a handler's chunk (its JSON text) may be at most this many bytes
    stream_maxlen: int = 10_000
    stream_chunk_max_bytes: int = 65_536

    def sla_ms(self) -> list[int]:
        return [int(s * 1000) for s in (self.sla_p0_s, self.sla_p1_s, self.sla_p2_s, self.sla_p3_s)]

    def defer_ms(self) -> list[int]:
        return [int(min(self.defer_s, s / 1000 / 2) * 1000) for s in self.sla_ms()]

    def holder_wait_ms(self) -> list[int]:
        """Per priority; online and nearline work never waits for a busy GPU."""
        return [0, 0] + [int(min(self.holder_wait_s, s / 1000 / 2) * 1000) for s in self.sla_ms()[2:]]

    def levels(self) -> str:
        """The priorities this worker serves as claim.lua's level string, e.g. "01"."""
        try:
            picked = {int(Priority.parse(p)) for p in self.priorities.split(",") if p.strip()}
        except GpuqError:
            raise ConfigError(f"priorities {self.priorities!r}: use a list of P0..P3, e.g. P0,P1") from None
        if not picked:
            raise ConfigError("priorities must name at least one of P0..P3")
        return "".join(str(p) for p in sorted(picked))

    def validate(self) -> Config:
        # a pool names keys and goes into ACL rules (gpuq acl): whitespace or a quote there
        # would split a rule or add one
        if not self.pool or any(c.isspace() or not c.isprintable() or c in "{}:\"'" for c in self.pool):
            raise ConfigError(f"pool {self.pool!r} must be non-empty without braces, colons, "
                              "quotes or spaces")
        # a brace in the prefix would move the pool's hash tag (gpuq.keys: PREFIX:{pool}:),
        # off the slot gpuq.cluster.pool_slot computes
        # empty, it would name another keyspace (":{pool}:...") than processes without it
        if not self.prefix or any(c.isspace() or not c.isprintable() or c in "{}\"'" for c in self.prefix):
            raise ConfigError(f"prefix {self.prefix!r} must be non-empty without braces, quotes or spaces")
        at_least_one = ("fair_every", "concurrency", "exporter_models", "scan_per_queue")
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):  # "nan" parses as a float
                raise ConfigError(f"{f.name} must be a finite number, got {value}")
            least = 1 if f.name in at_least_one else 0  # said as the bound it breaks: -3 is not told ">= 0"
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < least:
                raise ConfigError(f"{f.name} must be >= {least}, got {value}")
        self.levels()
        if self.concurrency > MAX_CONCURRENCY:  # a thread each: 100,000 took 12 s to start, to do nothing
            raise ConfigError(f"concurrency must be 1..{MAX_CONCURRENCY}, got {self.concurrency}")
        if self.replica_acks and not self.replica_wait_ms:
            raise ConfigError("replica_wait_ms must be > 0 when replica_acks is set")
        if self.scale_signal not in ("forecast", "reactive"):
            raise ConfigError(f"scale_signal {self.scale_signal!r}: forecast or reactive")
        if not 0 < self.forecast_utilisation <= 1:
            raise ConfigError("forecast_utilisation must be > 0 and <= 1")
        if self.forecast_margin < 0:
            raise ConfigError("forecast_margin must be >= 0")
        if self.stream_maxlen < 1:
            raise ConfigError("stream_maxlen must be >= 1")
        if not 1 <= self.stream_chunk_max_bytes <= 1 << 20:
            raise ConfigError("stream_chunk_max_bytes must be from 1 to 1048576")
        if self.load_backoff_max_s < self.load_backoff_s:
            raise ConfigError(f"load_backoff_max_s ({self.load_backoff_max_s}) must be >= "
                              f"load_backoff_s ({self.load_backoff_s})")
        if not 0 < self.heartbeat_s < self.lease_s:
            raise ConfigError(f"heartbeat_s ({self.heartbeat_s}) must be > 0 and < lease_s ({self.lease_s})")
        return self

    def with_options(self, **options: Any) -> Config:
        """Override with the options that were given (None means not given)."""
        given = {k: v for k, v in options.items() if v is not None}
        return replace(self, **given).validate()

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, /, **given: Any) -> Config:
        """The GPUQ_* settings, with the options ``given`` (None: not given) in place of
        their variables, which are then not read: a flag wins over a bad variable."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        for f in fields(cls):
            raw = env.get(f"GPUQ_{f.name.upper()}")
            if raw is None or f.name in values:
                continue
            kind = type(getattr(cls(), f.name))
            try:
                values[f.name] = kind(raw)
            except ValueError:
                raise ConfigError(f"GPUQ_{f.name.upper()}={raw!r} is not a valid {kind.__name__}") from None
        return cls(**values).validate()
