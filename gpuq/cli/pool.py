"""Commands that run or watch a pool's processes: worker, reaper, rq-bridge, exporter,
status, top, demo; and its tools: simulate (trace replay), acl (least-privilege users)."""

from __future__ import annotations

import json
import math
import signal
from dataclasses import replace
from typing import Any

import click
import redis

from gpuq import eviction
from gpuq.cli.base import (
    DEFAULTS,
    PRIORITY_HELP,
    config_of,
    no_preempt_option,
    open_queue,
    priority_type,
    task_option,
)
from gpuq.cli.tasks import within
from gpuq.connection import redis_errors
from gpuq.errors import ConfigError
from gpuq.names import MAX_NAME_LEN, name_problem
from gpuq.task import Priority
from gpuq.tls import Tls
from gpuq.views.inspect import pool_view

# a number given must be finite (nan passes every comparison click's ranges make)
SECONDS = within("a finite number >= 0", lambda v: 0 <= v < math.inf)
POSITIVE = within("a finite number > 0", lambda v: 0 < v < math.inf)


def _worker_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--name: an id is in its keys (worker:<id>:tasks: no colon) and status: no space, brace or comma."""
    if value is not None and (not value or name_problem(value) or ":" in value):
        raise ConfigError(f"--name {value!r}: a worker id must be 1..{MAX_NAME_LEN} printable "
                          "characters without spaces, commas, braces or colons")
    return value


def _levels(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--priorities: an empty item is a typo, not "no level" (P0,,P1)."""
    if value is not None and any(not p.strip() for p in value.split(",")):
        raise ConfigError(f"--priorities {value!r}: an item is empty; use a list like P0,P1")
    return value


@click.command()
@click.option("--app", "app_path", required=True, help="module:attr of a gpuq.App.")
@click.option("--gpu", "gpu_index", default=None,
              help="GPU index (NVML), or a group of GPUs on this host, e.g. 0,1,2,3: the worker "
                   "serves them as one tensor-parallel group.")
@click.option("--gpu-count", type=int, default=None,
              help="GPUs in the group (declared with --vram-gb, else NVML devices 0..N-1).")
@click.option("--vram-gb", type=float, default=None,
              help="Declare GPUs of this size (each, in a group; at most 1000000) instead of NVML.")
@click.option("--gpu-name", default=None, help="Name of the declared GPU class.")
@click.option("--concurrency", type=int, default=None,
              help=f"Tasks run at once, 1..4096 (default {DEFAULTS.concurrency}).")
@click.option("--name", "worker_id", default=None, callback=_worker_id,
              help="Worker id (default host-gpu-random); one whose worker still beats is refused.")
@click.option("--burst", is_flag=True,
              help="Exit when no queued task is left that this worker can run; delayed tasks "
                   "(retries in backoff too) are left to other workers.")
@click.option("--idle-timeout", "idle_timeout_s", type=float, default=None, callback=SECONDS,
              help="Idle seconds before unloading models and retiring above the pool's "
                   f"min_workers (default {DEFAULTS.idle_timeout_s:g}; 0: never; env GPUQ_IDLE_TIMEOUT_S).")
@click.option("--load-backoff", "load_backoff_s", type=float, default=None, callback=SECONDS,
              help="Seconds a model whose load failed here is left to other workers, doubled at each "
                   f"failure in a row (default {DEFAULTS.load_backoff_s:g}; env GPUQ_LOAD_BACKOFF_S).")
@click.option("--load-backoff-max", "load_backoff_max_s", type=float, default=None, callback=SECONDS,
              help=f"The longest such backoff (default {DEFAULTS.load_backoff_max_s:g}; "
                   "env GPUQ_LOAD_BACKOFF_MAX_S).")
@click.option("--priorities", default=None, callback=_levels,
              help="Serve only these priorities, e.g. P0,P1: a dedicated lane (env GPUQ_PRIORITIES).")
@click.option("--metrics-port", type=int, default=None,
              callback=within("0..65535 (0: none)", lambda p: 0 <= p <= 65535),
              help="Serve this worker's Prometheus metrics on this port (env GPUQ_METRICS_PORT).")
@click.option("--metrics-host", help=f"Address of the metrics port (default {DEFAULTS.metrics_host}; "
              "0.0.0.0: every interface, e.g. in a container; env GPUQ_METRICS_HOST).")
@click.option("--rq-allow", multiple=True,
              help="Run RQ jobs whose function lives under this module (repeatable; needs gpuq[rq]).")
@click.option("--rq-redis", "rq_url", default=None, help="RQ's Redis URL (default: --redis).")
@click.pass_context
def worker(ctx: click.Context, app_path: str, gpu_index: str | None, gpu_count: int | None,
           vram_gb: float | None, gpu_name: str | None, concurrency: int | None,
           worker_id: str | None, burst: bool,
           idle_timeout_s: float | None, load_backoff_s: float | None, load_backoff_max_s: float | None,
           priorities: str | None, metrics_port: int | None, metrics_host: str | None,
           rq_allow: tuple[str, ...], rq_url: str | None) -> None:
    """Run one worker process on one GPU or a group of GPUs."""
    from gpuq.app import load_app
    from gpuq.rq.support import enable_worker, require
    from gpuq.worker import Worker
    from gpuq.worker.gpu import probe

    if rq_allow:
        require()  # before anything else: the rq extra is missing
    cfg = config_of(ctx).with_options(  # bad settings: one line before Redis is reached
        concurrency=concurrency, idle_timeout_s=idle_timeout_s, priorities=priorities,
        load_backoff_s=load_backoff_s, load_backoff_max_s=load_backoff_max_s,
        metrics_port=metrics_port, metrics_host=metrics_host)
    waits = max(cfg.idle_block_s, cfg.heartbeat_s)  # its longest pops: idle, control
    cfg = replace(cfg, redis_url=(queue := open_queue(ctx, block_s=waits)).url)
    app = load_app(app_path)
    enable_worker(app, rq_allow, rq_url or queue.url, queue)
    gpu = probe(gpu_index, vram_gb, gpu_name, worker_id or "worker", gpu_count, cfg.kv_reserve_gb)
    ctx.exit(Worker(queue.redis, cfg, app, gpu, worker_id=worker_id, burst=burst).run())


@click.command()
@click.option("--once", is_flag=True, help="One round (recovery, expiry, preemption, scaling), then exit; "
              "none while another reaper holds the pool's lock.")
@click.option("--max-wait", "max_wait_s", type=float, default=None, callback=SECONDS,
              help="Wait for a victim ending within this many seconds instead of interrupting "
                   f"one (default {DEFAULTS.max_wait_s:g}; env GPUQ_MAX_WAIT_S).")
@click.option("--grace", "grace_s", type=float, default=None, callback=SECONDS,
              help=f"Seconds a task asked to yield has before it is stopped (default {DEFAULTS.grace_s:g}; "
                   "env GPUQ_GRACE_S).")
@click.option("--min-workers", type=int, default=None,
              help="Idle workers retire only while more than this many are live "
                   f"(default {DEFAULTS.min_workers}; env GPUQ_MIN_WORKERS).")
@click.option("--on-scale", default=None,
              help="Command run with CLASS CURRENT DESIRED when a GPU class's desired worker "
                   "count changes or its live count falls below it (env GPUQ_ON_SCALE).")
@click.pass_context
def reaper(ctx: click.Context, once: bool, max_wait_s: float | None, grace_s: float | None,
           min_workers: int | None, on_scale: str | None) -> None:
    """Keep the pool honest: recover dead workers' tasks, expire missed deadlines, preempt
    for waiting online work, publish scale signals (one active reaper per pool)."""
    from gpuq.reaper import Reaper

    queue = open_queue(ctx, block_s=config_of(ctx).reap_interval_s)  # its wait between rounds
    cfg = queue.config.with_options(max_wait_s=max_wait_s, grace_s=grace_s,
                                    min_workers=min_workers, on_scale=on_scale)
    r = Reaper(queue.redis, cfg)
    if once:
        with redis_errors(queue.url):
            r.warn_eviction()  # as the looping reaper does at start
            done = r.once()
        if done is None:
            click.echo(f"another reaper holds pool {cfg.pool}'s lock and runs its rounds: this one "
                       "did nothing", err=True)
            return
        click.echo(done.summary())
        return
    ctx.exit(r.run())


@click.command("rq-bridge")
@click.option("--rq-queue", "rq_queues", multiple=True, required=True,
              help="RQ queue to take jobs from (repeatable).")
@click.option("--rq-redis", "rq_url", default=None, help="RQ's Redis URL (default: --redis).")
@task_option("model", "Default model for jobs without meta['gpuq']['model'].", given_only=True)
@task_option("vram_gb", "Default VRAM need (GB), weights included.", given_only=True)
@task_option("priority", f"Default priority: {PRIORITY_HELP}", given_only=True, type=priority_type)
@task_option("est_s", "Default estimated run seconds.", given_only=True)
@task_option("deadline_s", "Default seconds from enqueue the task must end by.", given_only=True)
@task_option("tenant", "Default tenant.", given_only=True)
@no_preempt_option("By default, never preempt these tasks.")
@task_option("max_attempts", "Default attempts (else RQ's Retry(max=n) + 1, else 1, as RQ).", given_only=True)
@click.option("--burst", "--once", "burst", is_flag=True, help="Exit once every RQ queue is empty.")
@click.pass_context
def rq_bridge(ctx: click.Context, /, rq_queues: tuple[str, ...], rq_url: str | None, no_preempt: bool,
              burst: bool, **defaults: Any) -> None:
    """Move jobs from RQ queues into gpuq tasks (reliably; needs gpuq[rq])."""
    from gpuq.rq.support import require, rq_client

    require()
    from gpuq.rq.bridge import Bridge
    from gpuq.rq.fields import check_defaults

    defaults["preemptible"] = None if not no_preempt else False  # None: not given
    check_defaults(defaults)
    queue = open_queue(ctx)  # its pops are on RQ's client
    url = rq_url or queue.url
    bridge = Bridge(queue, rq_client(url, Tls.of(queue.config)), url, list(rq_queues), defaults, burst=burst)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a pod's stop ends it as Ctrl-C does
    code = bridge.run()
    click.echo(f"rq-bridge: {bridge.delivered} delivered, {bridge.refused} refused", err=True)
    ctx.exit(code)


@click.command()
@click.option("--port", type=int, default=9108, show_default=True, help="HTTP port of /metrics.",
              callback=within("1..65535", lambda p: 1 <= p <= 65535))
@click.option("--host", envvar="GPUQ_EXPORTER_HOST", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; env GPUQ_EXPORTER_HOST).")
@click.option("--top-models", "exporter_models", type=int, default=None,
              help="Per-model series kept per metric, the deepest queues (most loads, most "
                   "workers desired) first; the rest are summed as model \"other\" (default "
                   f"{DEFAULTS.exporter_models}; env GPUQ_EXPORTER_MODELS).")
@click.pass_context
def exporter(ctx: click.Context, port: int, host: str, exporter_models: int | None) -> None:
    """Serve the pool's metrics (queues, outcomes, SLA attainment, preemptions, model loads,
    workers, scale signals) for Prometheus, read from Redis on every scrape."""
    from gpuq.views.exporter import Exporter

    queue = open_queue(ctx)
    cfg = queue.config.with_options(exporter_models=exporter_models)
    ctx.exit(Exporter(queue.redis, queue.keys, cfg.exporter_models).serve(port, host))


@click.command()
@click.option("--interval", "interval_s", type=float, default=1.0, show_default=True, callback=POSITIVE,
              help="Seconds between refreshes.")
@click.option("--once", is_flag=True, help="Print one frame and exit (also when not a terminal).")
@click.pass_context
def top(ctx: click.Context, interval_s: float, once: bool) -> None:
    """Live view of the pool: queues, workers and their GPUs, SLA attainment, recent misses."""
    from gpuq.views.top import run_top

    queue = open_queue(ctx)
    with redis_errors(queue.url):
        ctx.exit(run_top(queue.redis, queue.keys, interval_s=interval_s, once=once))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Queues by priority and model; workers, their GPUs and what they run."""
    queue = open_queue(ctx)
    with redis_errors(queue.url):  # the server check here, not in every scrape's view
        view = pool_view(queue.redis, queue.keys)
        view = replace(view, warnings=[w for w in (eviction.risk(queue.redis),) if w])
    if as_json:
        click.echo(json.dumps(view.to_dict(), indent=2))
        return
    from gpuq.views.render import render_status

    click.echo(render_status(view))


@click.command()
@click.option("--trace", "trace_name", default="genai", show_default=True,
              help="genai, openb, azure or mooncake (files in --traces-dir), or a CSV file (plain "
                   "or gzip'd) of your own requests: columns arrival_s, model, priority, service_s; "
                   "optional vram_gb, est_s, deadline_s, preemptible, tenant, load_s "
                   "(docs/SIMULATOR.md).")
@click.option("--traces-dir", default=None,
              help="Folder of the shared traces and measured load times (env GPUQ_TRACES).")
@click.option("--gpus", default="4x80,2x48,2x24", show_default=True,
              help="COUNTxGB[/LEVELS],...; COUNTxGPUSxGB for workers of GPUS-GPU groups, e.g. 2x4x80 "
                   "(4096 GPUs at most).")
@click.option("--mix-70b", type=float, default=0.0,
              help="Make this share (0..1) of the trace's models 70B: 144 GB over two GPUs.")
@click.option("--speedup", type=float, default=None, callback=POSITIVE, help="Divide arrival times by K.")
@click.option("--target-load", type=float, default=None, callback=POSITIVE,
              help="Pick the speedup so offered work is this share of the pool (default 0.8).")
@click.option("--policy", type=click.Choice(["gpuq", "fifo", "priority", "all"]), default="all",
              show_default=True, help="Scheduler to replay the trace with.")
@click.option("--limit", type=int, default=None, help="Replay only the first N tasks.")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (a list with --policy all).")
@click.option("--plot", "plot_path", default=None, help="Write latency CDFs and GPU busy timelines (PNG).")
@click.option("--find-gpus", is_flag=True,
              help="Search the smallest pool of the --gpus kind (e.g. 1x80) meeting --sla-target.")
@click.option("--sla-target", type=float, default=0.99, show_default=True,
              callback=within("0..1", lambda v: 0 <= v <= 1),
              help="With --find-gpus: the share of --sla-priority tasks to start within SLA.")
@click.option("--sla-priority", type=priority_type, default="P0", show_default=True,
              help="With --find-gpus: the priority whose SLA must be met.")
@click.option("--tenant", "tenant_specs", multiple=True, metavar="NAME[:WEIGHT[:MAX_GPUS[:MAX_VRAM_GB]]]",
              help="Register a tenant for gpuq's replay (repeatable); the report adds each one's waits.")
@click.option("--warm-hints", is_flag=True,
              help="gpuq's GPUs take the reaper's warm hints, as workers do (slower; docs/SIMULATOR.md).")
@click.option("--autoscale", "autoscale", default=None, metavar="MIN:MAX",
              help="gpuq with an autoscaler over the one --gpus kind (docs/SIMULATOR.md).")
@click.option("--scale-signal", type=click.Choice(["reactive", "forecast", "both"]), default="both",
              show_default=True, help="With --autoscale: the scale signal(s) to replay.")
@click.option("--boot-s", type=float, default=60.0, show_default=True, callback=SECONDS,
              help="With --autoscale: a new GPU's cold start before it joins.")
@click.option("--idle-s", type=float, default=300.0, show_default=True, callback=SECONDS,
              help="With --autoscale: a GPU idle this long leaves (above MIN).")
@click.option("--scale-every-s", type=float, default=15.0, show_default=True,
              callback=within("a finite number >= 0.1", lambda v: 0.1 <= v < math.inf),
              help="With --autoscale: how often the autoscaler reads the scale signals.")
@click.pass_context
def simulate(ctx: click.Context, trace_name: str, traces_dir: str | None, gpus: str,
             speedup: float | None, target_load: float | None, policy: str, limit: int | None,
             seed: int, as_json: bool, plot_path: str | None, find_gpus: bool,
             sla_target: float, sla_priority: Priority, autoscale: str | None, scale_signal: str,
             boot_s: float, idle_s: float, scale_every_s: float, tenant_specs: tuple[str, ...],
             mix_70b: float, warm_hints: bool) -> None:
    """Replay a production trace through the real scheduling scripts on a virtual clock,
    next to FIFO and strict-priority baselines."""
    from gpuq.sim.cli import load_for, run_simulations, unused_options

    unused_options(autoscale is not None, find_gpus, plot_path=plot_path, mix_70b=mix_70b,
                   tenants=tenant_specs, policy=policy, warm_hints=warm_hints,
                   given={p.name for p in ctx.command.params if p.name
                          and ctx.get_parameter_source(p.name) is not click.core.ParameterSource.DEFAULT})
    chosen = None if speedup is not None else load_for(target_load)  # the text report's heading
    if autoscale is not None:
        from gpuq.sim.cli import run_autoscaled

        scaled = run_autoscaled(trace_name, traces_dir, gpus, speedup, target_load, limit, seed,
                                config_of(ctx), autoscale, scale_signal, boot_s=boot_s, idle_s=idle_s,
                                every_s=scale_every_s)
        if as_json:
            click.echo(json.dumps(scaled if len(scaled) > 1 else scaled[0], indent=2))
            return
        from gpuq.sim.report import heading, render

        click.echo(heading(scaled[0], chosen) + "\n\n" + render(scaled))
        return

    if find_gpus:
        from gpuq.sim.cli import find_gpus as search

        found = search(trace_name, traces_dir, gpus, speedup, target_load, limit, seed,
                       config_of(ctx), sla_target, int(sla_priority))
        if as_json:
            click.echo(json.dumps(found, indent=2))
            return
        tried = ", ".join(f"{n}: {'-' if a is None else f'{100 * a:.1f}%'}"
                          for n, a in found["tried"].items())
        click.echo(f"{found['priority']} within SLA by pool size ({found['gpu_gb']:g} GB GPUs, speedup "
                   f"{found['speedup']:.3g}): {tried}")
        click.echo(f"smallest pool meeting {100 * sla_target:g}%: "
                   + (f"{found['gpus']} x {found['gpu_gb']:g} GB" if found["gpus"] else "none up to 256"))
        return

    from gpuq.tenants import Tenant

    tenants = [Tenant.from_spec(s) for s in tenant_specs]
    reports = run_simulations(trace_name, traces_dir, gpus, speedup, target_load, policy, limit,
                              seed, config_of(ctx), plot_path, tenants, mix_70b, warm_hints)
    if as_json:
        click.echo(json.dumps(reports if policy == "all" else reports[0], indent=2))
        return
    from gpuq.sim.report import heading, render, render_split

    click.echo(heading(reports[0], chosen) + "\n\n" + render(reports))
    if tenants:
        click.echo("\n" + render_split(reports))
    if mix_70b:
        click.echo(f"\n{len(reports[0]['models_70b'])} models made 70B (144 GB on 2 GPUs):\n"
                   + render_split(reports, "by_size", "MODELS"))


@click.command()
@click.option("--seconds", type=float, default=20.0, show_default=True, help="Producer run time.")
@click.option("--time-scale", type=float, default=0.05, show_default=True,
              help="Multiplier on simulated load and run times.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the workload.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def demo(ctx: click.Context, seconds: float, time_scale: float, seed: int, as_json: bool) -> None:
    """Simulated GPUs (80, 80, 48, 24 GB and a group of two 80 GB) as real worker processes on a
    mixed workload, a 70B model on the group among it."""
    from gpuq.demo import run_demo

    ctx.exit(run_demo(config_of(ctx), seconds=seconds, time_scale=time_scale, as_json=as_json,
                      seed=seed))


@click.command()
@click.option("--role", required=True,
              type=click.Choice(["producer", "worker", "reaper", "operator", "observer"]),
              help="operator: gpuq tenant; observer: status, top and exporter only.")
@click.option("--user", help="ACL user name (default PREFIX-ROLE-POOL: gpuq-ROLE-POOL).")
@click.option("--password-env", metavar="VAR", required=True,
              help="Variable holding the user's password (printed as its SHA-256 only).")
@click.pass_context
def acl(ctx: click.Context, role: str, user: str | None, password_env: str) -> None:
    """Print the ACL SETUSER line giving a role the least it needs on this pool: its keys
    only, and only the commands its code and Lua scripts send."""
    from gpuq.acl import setuser_from_env

    cfg = config_of(ctx)
    name = f"{cfg.prefix}-{role}-{cfg.pool}" if user is None else user  # a prefix's own; "" refused
    click.echo(setuser_from_env(role, cfg.pool, name, password_env, cfg.prefix))


@click.command("load-functions")
@click.pass_context
def load_functions(ctx: click.Context) -> None:
    """Load this gpuq version's function library into the server (every primary of a
    Cluster), as an administrator does where ACL roles may not (gpuq acl); prints its name.
    Clients load it themselves where their user may."""
    from gpuq.functions import already_loaded

    q = open_queue(ctx)
    with redis_errors(q.url):
        try:
            q.redis.function_load(q.scripts.sender.library.source)
        except redis.ResponseError as exc:
            if not already_loaded(exc):
                raise click.ClickException(f"the server refused the library: {exc}") from None
    click.echo(q.scripts.sender.library.name)


COMMANDS = (worker, reaper, rq_bridge, exporter, top, status, simulate, demo, acl, load_functions)
