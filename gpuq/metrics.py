"""Every Prometheus metric gpuq exports, in one place.

Two sources, so nothing is counted twice: each worker serves what only it sees (its GPU and
the phases of the tasks it runs) on ``gpuq worker --metrics-port``; ``gpuq exporter`` serves
pool-level figures read from Redis at scrape time (queues, outcomes, SLA attainment,
preemptions, model loads, workers, scale signals), which stay right across worker restarts
and whatever language the workers are written in. Labels are pool, priority (P0..P3), model,
gpu (the worker id: one worker per GPU or group; a group's per-device VRAM gauges add the
device, `<id>:<n>`), gpu_class (its GPU name), kind, outcome, state,
phase, result, source, resource, preempted_priority, tenant; never a task id. A scrape whose
figures cannot be read (Redis away) answers 503 with one log line (gpuq.metrics_http).

Worker (``WorkerMetrics``, one registry per worker process):

| metric | type | labels | emitted |
|---|---|---|---|
| gpuq_schedule_latency_seconds | histogram | pool, priority | at a task's first handler start (once per task, as its SLA is decided: at claim when the worker holds its model, after the load when cold): enqueue (a delayed or released task: its due time) to handler start |
| gpuq_task_phase_seconds | histogram | pool, priority, phase (queue, load, run) | queue: at claim, every attempt (time since it was last queued); load: after a cold load; run: when the handler returns |
| gpuq_worker_tasks_total | counter | pool, gpu, priority, outcome (succeeded, failed, retried, passed, yielded, stopped, lost) | when the worker settles a task |
| gpuq_gpu_vram_total_bytes | gauge | pool, gpu, gpu_class | at start |
| gpuq_gpu_vram_usage_ratio | gauge | pool, gpu, gpu_class, source (ledger, nvml) | every heartbeat; nvml only on NVML GPUs |
| gpuq_worker_running_tasks | gauge | pool, gpu | every heartbeat |
| gpuq_worker_loaded_models | gauge | pool, gpu | every heartbeat |
| gpuq_worker_model_load_failures_total | counter | pool, gpu, model | when a model's loader raises on the worker (its claims then skip the model for a backoff: gpuq.worker.broken) |

Pool (``PoolCollector`` over ``PoolFigures``, which ``gpuq.views.exporter`` reads from Redis on each
scrape; served by ``gpuq exporter``):

| metric | type | labels | source |
|---|---|---|---|
| gpuq_queue_depth | gauge | pool, priority, model | `q:<p>:<model>` sizes; 0 with model "" for a priority whose queues are all empty, so no priority's series goes missing; per priority the `exporter_models` (50) deepest queues, the rest (and a model named `other`) summed as model `other` (their oldest wait in the next row) |
| gpuq_queue_oldest_wait_seconds | gauge | pool, priority, model | since the queue head last became queued (enqueued, due, requeued) |
| gpuq_tasks_running / gpuq_tasks_delayed / gpuq_tasks_waiting / gpuq_tasks_unschedulable / gpuq_tasks_parked | gauge | pool | running set, delayed set (retries in backoff, tasks enqueued with a delay), tasks waiting for their parents, tasks larger than every GPU class, queued tasks out of their queues while no live worker can hold them |
| gpuq_schedules | gauge | pool | periodic tasks (`gpuq schedule`) |
| gpuq_tasks_enqueued_total | counter | pool | `stats` enqueued |
| gpuq_tasks_total | counter | pool, priority, outcome (succeeded, failed, expired, canceled) | `stats` `<outcome>:P<n>`; priority `unleveled` (only once there is one) for corrupt hashes without a readable priority |
| gpuq_sla_starts_total | counter | pool, priority, result (met, missed) | `stats` `sla_met:P<n>` / `sla_missed:P<n>`, once per task at its first handler start (claim for a worker holding its model, began after a cold load): the handler started, model loaded, by the task's start-by time or not; a task that expires without ever starting counts missed |
| gpuq_sla_attainment_ratio | gauge | pool, priority | met / (met + missed) since the pool began: the share of handler starts within SLA |
| gpuq_preemptions_total | counter | pool, kind (reserved, yield_requested, yielded, stopped, withdrawn), preempted_priority | `stats` `preempt:<kind>:P<n>` |
| gpuq_fair_dispatches_total | counter | pool, priority | `stats` `fair:P<n>`: claims made by the fairness rule |
| gpuq_warm_hints_total | counter | pool | `stats` warm_hints |
| gpuq_model_loads_total / gpuq_model_load_seconds_total | counter | pool, model | the model catalog: the `exporter_models` most loaded models, the rest summed as `other`; a model shown keeps its series while the catalog lists it (an entry unused for 30 days leaves it), `other` keeps the counts of its models that leave (it does not fall while the exporter runs, which would read as a reset), and a model named `other` is counted in that row. Which models are shown is the exporter's own choice: a restarted exporter, or a second one, may show others, and `other` may then fall once (a reset to Prometheus for that one series) |
| gpuq_workers | gauge | pool, gpu_class, state (idle, busy, draining, silent, dead) | worker hashes and liveness; every state of a class with a worker listed, 0 included |
| gpuq_workers_desired / gpuq_workers_current | gauge | pool, gpu_class | the reaper's scale signals (`scale` hash); none while they are stale (this and the next two rows) |
| gpuq_model_workers_desired | gauge | pool, model | the reaper's scale signals: the `exporter_models` models desiring the most workers (and their arrival rates below) |
| gpuq_arrivals_forecast_per_second | gauge | pool, kind (now, forecast), gpu_class, model | the scale signals' arrival rates (`rate_per_s`, `forecast_per_s`): per class (model "") and per model (gpu_class "") |
| gpuq_scale_signal_age_seconds | gauge | pool | seconds since the reaper round that wrote the scale signals (their `at`), while one has a time; past 15 s, or three rounds of a reaper whose `reap_interval_s` is longer, they are stale (no reaper rewrites them) and the three rows above are left out |
| gpuq_scale_signal_stale_after_seconds | gauge | pool | that staleness bound, max(15, 3 × the largest `every_s` of the signals), exported with the age (alerts compare the two) |
| gpuq_reaper_active | gauge | pool | 1 while a reaper holds the pool's lock |
| gpuq_tenant_queued | gauge | pool, tenant, priority | tasks queued per tenant (tenancy on: `gpuq tenant`); the tenant families show every registered tenant and the `exporter_models` unregistered ones with the most queued tasks |
| gpuq_tenant_bound | gauge | pool, tenant | the running tasks the reaper lets the tenant have (`tenant:use` `bound:<t>`), while it sets one |
| gpuq_tenant_running / gpuq_tenant_running_gpus / gpuq_tenant_running_vram_gb | gauge | pool, tenant | a limited tenant's (caps or a bound) running tasks, the GPUs and VRAM they use (`tenant:use`) |
| gpuq_tenant_quota_use_ratio | gauge | pool, tenant, resource (gpus, vram) | a capped tenant's use over its cap |
| gpuq_tenant_sla_starts_total | counter | pool, tenant, priority, result (met, missed) | per tenant, as gpuq_sla_starts_total |
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# fine below a second (P0's 200 ms SLA, P1's 1 s), then wide enough for P2's 5 minutes
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0,
                   30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
PHASES = ("queue", "load", "run")
# gpuq_worker_tasks_total's outcomes (the table above; gpuq.worker.executor counts them)
WORKER_OUTCOMES = ("succeeded", "failed", "retried", "passed", "yielded", "stopped", "lost")


class WorkerMetrics:
    """The metrics one worker process serves about its own GPU and the tasks it runs."""

    def __init__(self, pool: str, gpu: str, gpu_class: str, devices: int = 1) -> None:
        self.registry = CollectorRegistry()
        self.pool, self.gpu, self.gpu_class = pool, gpu, gpu_class
        # the VRAM gauges have one series per device: gpu "<worker>" alone, "<worker>:<i>" in
        # a group (the i-th device of the group)
        self.devices = [gpu] if devices == 1 else [f"{gpu}:{i}" for i in range(devices)]
        r = self.registry
        self.schedule_latency = Histogram(
            "gpuq_schedule_latency_seconds",
            "Enqueue to a task's first handler start, its model loaded.",
            ["pool", "priority"], buckets=LATENCY_BUCKETS, registry=r)
        self.phase = Histogram(
            "gpuq_task_phase_seconds", "Seconds a task spent queued, loading its model, running.",
            ["pool", "priority", "phase"], buckets=LATENCY_BUCKETS, registry=r)
        self.tasks = Counter("gpuq_worker_tasks_total", "Tasks this worker settled, by outcome.",
                             ["pool", "gpu", "priority", "outcome"], registry=r)
        self.vram_total = Gauge("gpuq_gpu_vram_total_bytes", "The GPU's total VRAM.",
                                ["pool", "gpu", "gpu_class"], registry=r)
        self.vram_usage = Gauge("gpuq_gpu_vram_usage_ratio",
                                "Share of the GPU's VRAM in use: ledger (models, tasks, KV "
                                "reserve) and NVML's reading.",
                                ["pool", "gpu", "gpu_class", "source"], registry=r)
        self.running = Gauge("gpuq_worker_running_tasks", "Tasks running on this worker.",
                             ["pool", "gpu"], registry=r)
        self.models = Gauge("gpuq_worker_loaded_models", "Models resident on this GPU.",
                            ["pool", "gpu"], registry=r)
        self.load_failures = Counter("gpuq_worker_model_load_failures_total",
                                     "Loads of a model that failed on this worker.",
                                     ["pool", "gpu", "model"], registry=r)

    def queued(self, priority: str, queued_s: float) -> None:
        self.phase.labels(self.pool, priority, "queue").observe(max(0.0, queued_s))

    def first_start(self, priority: str, waited_s: float) -> None:
        """Enqueue to the task's first handler start (the start that decided its SLA)."""
        self.schedule_latency.labels(self.pool, priority).observe(max(0.0, waited_s))

    def phase_done(self, priority: str, phase: str, seconds: float) -> None:
        self.phase.labels(self.pool, priority, phase).observe(max(0.0, seconds))

    def load_failed(self, model: str) -> None:
        self.load_failures.labels(self.pool, self.gpu, model).inc()

    def settled(self, priority: str, outcome: str) -> None:
        self.tasks.labels(self.pool, self.gpu, priority, outcome).inc()

    def gpu_state(self, total_gb: float, used_ledger_gb: float, nvml_used_gb: list[float] | None,
                  running: int, models: int) -> None:
        """total_gb and used_ledger_gb: the whole group (the ledger's share is the same on each
        device: a group shards evenly); nvml_used_gb: each device's reading."""
        device_gb = total_gb / len(self.devices)
        for i, gpu in enumerate(self.devices):
            self.vram_total.labels(self.pool, gpu, self.gpu_class).set(device_gb * 2**30)
            if device_gb <= 0:
                continue
            self.vram_usage.labels(self.pool, gpu, self.gpu_class, "ledger").set(
                used_ledger_gb / total_gb)
            if nvml_used_gb is not None and i < len(nvml_used_gb):
                self.vram_usage.labels(self.pool, gpu, self.gpu_class, "nvml").set(
                    nvml_used_gb[i] / device_gb)
        self.running.labels(self.pool, self.gpu).set(running)
        self.models.labels(self.pool, self.gpu).set(models)


@dataclass
class PoolFigures:
    """What the exporter read from Redis for one scrape (gpuq.views.exporter.read_figures)."""

    pool: str
    queues: list[tuple[str, str, int, float]] = field(default_factory=list)  # priority, model, depth, oldest wait s
    running: int = 0
    delayed: int = 0
    waiting: int = 0  # tasks waiting for their parents
    schedules: int = 0  # periodic tasks
    unschedulable: int = 0
    parked: int = 0
    stats: dict[str, int] = field(default_factory=dict)  # the pool's `stats` hash
    model_loads: list[tuple[str, int, float]] = field(default_factory=list)  # model, loads, total s
    workers: dict[tuple[str, str], int] = field(default_factory=dict)  # (gpu_class, state) -> n
    desired: list[tuple[str, str, int, int]] = field(default_factory=list)  # kind, name, current, desired
    # kind ("class"/"model"), name, arrivals now and forecast (per second)
    forecast: list[tuple[str, str, float, float]] = field(default_factory=list)
    reaper_active: bool = False
    scale_age_s: float | None = None  # PoolView.scale_age_s
    scale_stale_after_s: float = 0.0  # the age past which they are stale (views.inspect)
    tenants: list[dict[str, Any]] = field(default_factory=list)  # PoolView.tenants


PRIORITIES = ("P0", "P1", "P2", "P3")
OUTCOMES = ("succeeded", "failed", "expired", "canceled")
# how preemption went, as the scripts count it (stats "preempt:<kind>"): the planner
# reserved a worker or asked a task to yield; the task yielded, was stopped past its grace,
# or the request was withdrawn (the task it was for started or ended first)
PREEMPTION_KINDS = ("reserved", "yield_requested", "yielded", "stopped", "withdrawn")

# every family either source exports (tests check dashboards and rules against this)
METRIC_NAMES = {
    "gpuq_schedule_latency_seconds": "histogram", "gpuq_task_phase_seconds": "histogram",
    "gpuq_worker_tasks_total": "counter", "gpuq_gpu_vram_total_bytes": "gauge",
    "gpuq_gpu_vram_usage_ratio": "gauge", "gpuq_worker_running_tasks": "gauge",
    "gpuq_worker_loaded_models": "gauge", "gpuq_worker_model_load_failures_total": "counter",
    "gpuq_queue_depth": "gauge", "gpuq_queue_oldest_wait_seconds": "gauge",
    "gpuq_tasks_running": "gauge", "gpuq_tasks_delayed": "gauge", "gpuq_tasks_waiting": "gauge",
    "gpuq_schedules": "gauge",
    "gpuq_tasks_unschedulable": "gauge", "gpuq_tasks_parked": "gauge", "gpuq_tasks_enqueued_total": "counter",
    "gpuq_tasks_total": "counter", "gpuq_sla_starts_total": "counter",
    "gpuq_sla_attainment_ratio": "gauge", "gpuq_preemptions_total": "counter",
    "gpuq_fair_dispatches_total": "counter", "gpuq_warm_hints_total": "counter",
    "gpuq_model_loads_total": "counter", "gpuq_model_load_seconds_total": "counter",
    "gpuq_workers": "gauge", "gpuq_workers_desired": "gauge", "gpuq_workers_current": "gauge",
    "gpuq_model_workers_desired": "gauge", "gpuq_reaper_active": "gauge",
    "gpuq_scale_signal_age_seconds": "gauge", "gpuq_scale_signal_stale_after_seconds": "gauge",
    "gpuq_arrivals_forecast_per_second": "gauge",
    "gpuq_tenant_queued": "gauge", "gpuq_tenant_bound": "gauge", "gpuq_tenant_running": "gauge",
    "gpuq_tenant_running_gpus": "gauge", "gpuq_tenant_running_vram_gb": "gauge",
    "gpuq_tenant_quota_use_ratio": "gauge", "gpuq_tenant_sla_starts_total": "counter",
}


class PoolCollector(Collector):
    """Pool-level families from a reader called on every scrape."""

    def __init__(self, read: Callable[[], PoolFigures]) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        f = self.read()
        pool, stats = f.pool, f.stats
        depth = GaugeMetricFamily("gpuq_queue_depth", "Queued tasks.", labels=["pool", "priority", "model"])
        oldest = GaugeMetricFamily("gpuq_queue_oldest_wait_seconds", "Wait of the queue's head task.",
                                   labels=["pool", "priority", "model"])
        for priority, model, n, wait in f.queues:
            depth.add_metric([pool, priority, model], n)
            oldest.add_metric([pool, priority, model], wait)
        # a series that vanishes when a priority drains breaks alerts and graphs on it
        for priority in sorted(set(PRIORITIES) - {q[0] for q in f.queues}):
            depth.add_metric([pool, priority, ""], 0)
        yield depth
        yield oldest
        for name, text, value in (("gpuq_tasks_running", "Tasks running.", f.running),
                                  ("gpuq_tasks_delayed", "Retries waiting out their backoff and "
                                   "tasks enqueued with a delay.", f.delayed),
                                  ("gpuq_tasks_waiting", "Tasks waiting for their parent tasks.", f.waiting),
                                  ("gpuq_schedules", "Periodic tasks.", f.schedules),
                                  ("gpuq_tasks_unschedulable", "Queued tasks larger than every GPU class.",
                                   f.unschedulable),
                                  ("gpuq_tasks_parked", "Queued tasks out of their queues while no "
                                   "live worker can hold them.", f.parked),
                                  ("gpuq_reaper_active", "1 while a reaper holds the pool's lock.",
                                   int(f.reaper_active))):
            gauge = GaugeMetricFamily(name, text, labels=["pool"])
            gauge.add_metric([pool], value)
            yield gauge
        yield _counter("gpuq_tasks_enqueued", "Tasks enqueued.", ["pool"],
                       [([pool], stats.get("enqueued", 0))])
        # "unleveled": corrupt hashes without a readable priority, ended (failed) all the same
        yield _counter("gpuq_tasks", "Tasks ended, by outcome.", ["pool", "priority", "outcome"],
                       [([pool, p, o], stats.get(f"{o}:{p}", 0)) for p in PRIORITIES for o in OUTCOMES]
                       + [([pool, "unleveled", o], n) for o in OUTCOMES
                          if (n := stats.get(f"{o}:unleveled", 0))])
        yield _counter("gpuq_sla_starts",
                       "First handler starts (model loaded) by the task's start-by time or not.",
                       ["pool", "priority", "result"],
                       [([pool, p, r], stats.get(f"sla_{r}:{p}", 0)) for p in PRIORITIES
                        for r in ("met", "missed")])
        ratio = GaugeMetricFamily("gpuq_sla_attainment_ratio",
                                  "Share of first handler starts (model loaded) within SLA.",
                                  labels=["pool", "priority"])
        for p in PRIORITIES:
            met, missed = stats.get(f"sla_met:{p}", 0), stats.get(f"sla_missed:{p}", 0)
            if met + missed:
                ratio.add_metric([pool, p], met / (met + missed))
        yield ratio
        yield _counter("gpuq_preemptions", "Preemption decisions and their outcomes.",
                       ["pool", "kind", "preempted_priority"],
                       [([pool, k, p], stats.get(f"preempt:{k}:{p}", 0)) for k in PREEMPTION_KINDS
                        for p in PRIORITIES])
        yield _counter("gpuq_fair_dispatches", "Claims made by the fairness rule.", ["pool", "priority"],
                       [([pool, p], stats.get(f"fair:{p}", 0)) for p in PRIORITIES[1:]])
        yield _counter("gpuq_warm_hints", "Preload hints sent to idle workers.", ["pool"],
                       [([pool], stats.get("warm_hints", 0))])
        yield _counter("gpuq_model_loads", "Model loads.", ["pool", "model"],
                       [([pool, m], n) for m, n, _ in f.model_loads])
        yield _counter("gpuq_model_load_seconds", "Seconds spent loading models.", ["pool", "model"],
                       [([pool, m], s) for m, _, s in f.model_loads])
        workers = GaugeMetricFamily("gpuq_workers", "Workers by GPU class and state.",
                                    labels=["pool", "gpu_class", "state"])
        for (gpu_class, state), n in sorted(f.workers.items()):
            workers.add_metric([pool, gpu_class, state], n)
        yield workers
        desired = GaugeMetricFamily("gpuq_workers_desired", "Workers the reaper asks for, per GPU class.",
                                    labels=["pool", "gpu_class"])
        current = GaugeMetricFamily("gpuq_workers_current", "Live workers per GPU class (scale signals).",
                                    labels=["pool", "gpu_class"])
        per_model = GaugeMetricFamily("gpuq_model_workers_desired", "Workers the reaper asks for, per model.",
                                      labels=["pool", "model"])
        for kind, name, cur, want in f.desired:
            if kind == "class":
                desired.add_metric([pool, name], want)
                current.add_metric([pool, name], cur)
            else:
                per_model.add_metric([pool, name], want)
        yield desired
        yield current
        yield per_model
        age = GaugeMetricFamily("gpuq_scale_signal_age_seconds",
                                "Seconds since the reaper round that wrote the scale signals.", labels=["pool"])
        # the bound beside the age, so an alert follows the reaper's interval (deploy/prometheus)
        bound = GaugeMetricFamily("gpuq_scale_signal_stale_after_seconds",
                                  "Age past which the scale signals are stale and left out.", labels=["pool"])
        if f.scale_age_s is not None:
            age.add_metric([pool], f.scale_age_s)
            bound.add_metric([pool], f.scale_stale_after_s)
        yield age
        yield bound
        rates = GaugeMetricFamily("gpuq_arrivals_forecast_per_second",
                                  "Arrivals per second now and one model load ahead (the scaler's forecast).",
                                  labels=["pool", "kind", "gpu_class", "model"])
        for kind, name, now, ahead in f.forecast:
            where = [name, ""] if kind == "class" else ["", name]
            rates.add_metric([pool, "now", *where], now)
            rates.add_metric([pool, "forecast", *where], ahead)
        yield rates
        yield from _tenant_families(pool, f.tenants)


def _tenant_families(pool: str,
                     tenants: list[dict[str, Any]]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """Per tenant: queued tasks per priority, the reaper's bound, running use against its caps
    (limited tenants: caps or a bound), SLA results at handler start."""
    queued = GaugeMetricFamily("gpuq_tenant_queued", "Tasks queued, per tenant and priority.",
                               labels=["pool", "tenant", "priority"])
    bound = GaugeMetricFamily("gpuq_tenant_bound", "Running tasks the reaper lets a tenant have "
                              "while other tenants' recent demand needs room.", labels=["pool", "tenant"])
    running = GaugeMetricFamily("gpuq_tenant_running", "Running tasks of a limited tenant (caps or bound).",
                                labels=["pool", "tenant"])
    gpus = GaugeMetricFamily("gpuq_tenant_running_gpus", "GPUs a limited tenant's running tasks run "
                             "across.", labels=["pool", "tenant"])
    vram = GaugeMetricFamily("gpuq_tenant_running_vram_gb", "VRAM of a limited tenant's running tasks.",
                             labels=["pool", "tenant"])
    ratio = GaugeMetricFamily("gpuq_tenant_quota_use_ratio", "A capped tenant's use over its cap.",
                              labels=["pool", "tenant", "resource"])
    for t in tenants:
        name = t["name"]
        for p in PRIORITIES:
            queued.add_metric([pool, name, p], t["queued"].get(p, 0))
        if t.get("bound") is not None:
            bound.add_metric([pool, name], t["bound"])
        if t["running"] is not None:
            running.add_metric([pool, name], t["running"])
            gpus.add_metric([pool, name], t["running_gpus"])
            vram.add_metric([pool, name], t["running_vram_gb"])
        for resource, used, cap in (("gpus", t["running_gpus"], t["max_gpus"]),
                                    ("vram", t["running_vram_gb"], t["max_vram_gb"])):
            if cap is not None:
                ratio.add_metric([pool, name, resource], (used or 0) / cap if cap else float(bool(used)))
    yield queued
    yield bound
    yield running
    yield gpus
    yield vram
    yield ratio
    yield _counter("gpuq_tenant_sla_starts", "First handler starts by the start-by time or not, per tenant.",
                   ["pool", "tenant", "priority", "result"],
                   [([pool, t["name"], p, r], t["sla"][p][r]) for t in tenants for p in PRIORITIES
                    for r in ("met", "missed")])


def _counter(name: str, text: str, labels: list[str],
             values: Sequence[tuple[list[str], float]]) -> CounterMetricFamily:
    """A counter family (``name`` without ``_total``: the client library adds it)."""
    family = CounterMetricFamily(name, text, labels=labels)
    for label_values, value in values:
        family.add_metric(label_values, value)
    return family
