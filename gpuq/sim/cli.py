"""What ``gpuq simulate`` runs: read the trace, size the compression, replay each policy."""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from gpuq.config import Config
from gpuq.embedded import EmbeddedServer, sigterm_unwinds
from gpuq.errors import ConfigError
from gpuq.report import percentile
from gpuq.sim import traces
from gpuq.sim.autoscale import Autoscale
from gpuq.sim.mix import with_70b
from gpuq.sim.model import SimResult, SimTask, TraceTask, devices_of
from gpuq.sim.policies import POLICIES
from gpuq.sim.reference import Request, first_request_misses
from gpuq.sim.report import summarize
from gpuq.sim.run import MAX_GPUS, fitting, parse_gpus, sim_config, simulate, speedup_for
from gpuq.tenants import Tenant

log = logging.getLogger(__name__)


def load_for(target_load: float | None) -> float:
    """The offered load a replay's speedup is picked for: --target-load, else 0.8."""
    return 0.8 if target_load is None else target_load


def check_plot_path(path: str) -> None:
    """``--plot``: refused before the replay, not after it (a replay may take minutes)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise ConfigError(f"--plot {path!r}: not a file that can be written in an existing folder")
    from gpuq.sim.plot import check  # matplotlib is imported only when a plot is asked for

    check(path)


def read_trace(name: str, traces_dir: str | None, seed: int,
               limit: int | None) -> tuple[list[TraceTask], traces.LoadTimes]:
    """The tasks of trace ``name`` (a named trace or a CSV file) and its models' load times;
    a missing, malformed or empty trace is a configuration error (one line in the CLI)."""
    if traces_dir is not None and not os.path.isdir(traces_dir):  # a file would be read as each
        raise ConfigError(f"--traces-dir {traces_dir!r} is not a folder (of the shared traces)")
    try:
        read = traces.read_trace(name, traces_dir, seed=seed, limit=limit)
        if not read.tasks:
            raise ConfigError(f"trace {name!r} has no tasks to replay")
        loads = traces.LoadTimes.for_trace(read, traces_dir)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(str(exc)) from None
    return read.tasks, loads


def replayable(name: str, tasks: list[TraceTask], gpus: list[tuple[str, float]],
               config: Config, tenants: Sequence[Tenant] = ()) -> list[TraceTask]:
    """The tasks the pool can hold (``fitting``: the rest are refused up front, as each
    replay refuses them); a ConfigError when it holds none, as for a trace without tasks."""
    kept = fitting(tasks, gpus, sim_config(config), tenants)
    if not kept:
        raise ConfigError(f"trace {name!r}: none of its {len(tasks)} tasks fits a GPU of the pool "
                          "(more VRAM than any GPU or group offers less the KV reserve, more GPUs "
                          "than any group has, a deadline under their own est_s, or past their "
                          "tenant's caps)")
    return kept


@contextmanager
def replaying() -> Iterator[EmbeddedServer]:
    """A server of its own for the replays, with the reaper's logs held back: a replay makes
    thousands of planner decisions and expiries, which are what it reports, not news."""
    reaper_log = logging.getLogger("gpuq.reaper")
    level = reaper_log.level
    reaper_log.setLevel(max(logging.ERROR, reaper_log.getEffectiveLevel()))
    with sigterm_unwinds():
        server = EmbeddedServer("redis")
        try:  # a SIGTERM while it starts stops it too (it runs in a session of its own)
            yield server.start()
        finally:
            reaper_log.setLevel(level)
            server.stop()


# the options of a mode, by parameter name: without the mode they would be passed over
MODE_OPTIONS = {"--autoscale": ("scale_signal", "boot_s", "idle_s", "scale_every_s"),
                "--find-gpus": ("sla_target", "sla_priority")}


def unused_options(autoscale: bool, find_gpus: bool, *, plot_path: str | None, mix_70b: float,
                   tenants: Sequence[str], policy: str, warm_hints: bool,
                   given: Collection[str] = ()) -> None:
    """A ConfigError for an option the chosen replay would pass over: --autoscale and
    --find-gpus replay gpuq alone, without a plot, a 70B mix or tenants; a mode's own options
    (MODE_OPTIONS; given: the parameters set on the command line) need the mode."""
    for mode, on in (("--autoscale", autoscale), ("--find-gpus", find_gpus)):
        stray = [f"--{name.replace('_', '-')}" for name in MODE_OPTIONS[mode] if name in given]
        if stray and not on:
            verb = "is" if len(stray) == 1 else "are"
            raise ConfigError(f"{', '.join(stray)} {verb} only used with {mode}")
    if warm_hints and policy in ("fifo", "priority"):  # a QA pass: it was passed over silently
        raise ConfigError(f"--warm-hints is for gpuq's replays; --policy {policy} runs none")
    if not (autoscale or find_gpus):
        return
    mode = "--autoscale" if autoscale else "--find-gpus"
    given = [name for name, on in (("--plot", plot_path), ("--mix-70b", mix_70b), ("--tenant", tenants),
                                   ("--policy " + policy, policy not in ("all", "gpuq")),
                                   ("--warm-hints", warm_hints and not autoscale)) if on]
    if autoscale and find_gpus:
        given.insert(0, "--find-gpus")
    if given:  # (an autoscaled replay takes warm hints anyway: --warm-hints is no change there)
        raise ConfigError(f"{mode} replays gpuq alone; it does not take {', '.join(given)}")


def run_simulations(trace_name: str, traces_dir: str | None, gpus_spec: str, speedup: float | None,
                    target_load: float | None, policy: str, limit: int | None, seed: int,
                    config: Config, plot_path: str | None = None,
                    tenants: Sequence[Tenant] = (), mix_70b: float = 0.0,
                    warm_hints: bool = False) -> list[dict[str, Any]]:
    """One report per policy; with ``tenants`` (registered for gpuq's replays) each report
    also has ``tenants``: per tenant named, its tasks' waits and SLA attainment. mix_70b:
    that share of the trace's models made 70B, on two GPUs (gpuq.sim.mix). warm_hints: gpuq's
    GPUs take the reaper's warm hints (gpuq.sim.hints)."""
    if speedup is not None and target_load is not None:
        raise ConfigError("give --speedup or --target-load, not both")
    if limit is not None and limit < 1:
        raise ConfigError("--limit must be >= 1")
    if plot_path:
        check_plot_path(plot_path)
    gpus = parse_gpus(gpus_spec)
    tasks, loads = read_trace(trace_name, traces_dir, seed, limit)
    large: list[str] = []
    if mix_70b:
        tasks, large = with_70b(tasks, loads, mix_70b, seed)
    kept = replayable(trace_name, tasks, gpus, config, tenants)
    if speedup is None:  # the load offered is the work of the tasks replayed, not of those refused
        speedup = speedup_for(kept, len(gpus), load_for(target_load))
    policies = list(POLICIES) if policy == "all" else [policy]
    results, reports = [], []
    with replaying() as server:  # one server for every policy's replay
        for name in policies:
            result = simulate(tasks, gpus, name, speedup=speedup, load_time=loads.sample,
                              seed=seed, config=config, server=server, tenants=tenants,
                              warm_hints=warm_hints)
            results.append(result)
            report = {"trace": trace_name, **summarize(result)}
            if mix_70b:
                report["models_70b"], report["by_size"] = large, by_size(result, large)
            if tenants:
                report["tenants"] = {t.name: tenant_figures(result, t.name) for t in tenants}
            reports.append(report)
            log.info("simulate.done policy=%s tasks=%d wall_s=%.1f", name, len(tasks), result.wall_s)
    if plot_path:
        from gpuq.sim.plot import plot

        plot(results, plot_path)
    return reports


SIGNALS = ("reactive", "forecast")


def one_kind(gpus_spec: str, mode: str) -> float:
    """The VRAM of the one kind of single GPUs ``--gpus`` names for ``mode``: its pools are
    made of GPUs of that kind alone (a group, ``COUNTxGPUSxGB``, would be replayed as one
    GPU of all its VRAM, and a lane as a GPU serving everything)."""
    gpus = parse_gpus(gpus_spec)
    kinds = {gb for _, gb in gpus}
    if len(kinds) != 1 or "/" in gpus_spec or any(devices_of(w) > 1 for w, _ in gpus):
        raise ConfigError(f"{mode} needs one GPU kind, of single GPUs: e.g. --gpus 1x80 "
                          f"(not {gpus_spec!r})")
    return kinds.pop()


def run_autoscaled(trace_name: str, traces_dir: str | None, gpus_spec: str, speedup: float | None,
                   target_load: float | None, limit: int | None, seed: int, config: Config,
                   spec: str, signal: str = "both", **settings: float) -> list[dict[str, Any]]:
    """gpuq with an autoscaler (``--autoscale MIN:MAX``) over GPUs of the one ``--gpus`` kind,
    once per scale signal (reactive, forecast or both), on the same arrivals and load draws.
    A report's ``policy`` names its signal. settings: Autoscale's boot_s, idle_s, every_s."""
    size = one_kind(gpus_spec, "--autoscale")
    if signal not in (*SIGNALS, "both"):
        raise ConfigError(f"--scale-signal {signal!r}: reactive, forecast or both")
    if speedup is not None and target_load is not None:
        raise ConfigError("give --speedup or --target-load, not both")
    autoscale = Autoscale.parse(spec, size, **settings)
    if autoscale.max > MAX_GPUS:
        raise ConfigError(f"--autoscale {spec!r}: a replay simulates at most {MAX_GPUS} GPUs")
    tasks, loads = read_trace(trace_name, traces_dir, seed, limit)
    kept = replayable(trace_name, tasks, [(autoscale.gpu_id(0), autoscale.gb)], config)
    if speedup is None:  # the load is offered to the largest pool
        speedup = speedup_for(kept, autoscale.max, load_for(target_load))
    reports = []
    with replaying() as server:
        for name in SIGNALS if signal == "both" else (signal,):
            result = simulate(tasks, [], "gpuq", speedup=speedup, load_time=loads.sample, seed=seed,
                              config=replace(config, scale_signal=name), server=server,
                              autoscale=autoscale)
            result.policy = name
            reports.append({"trace": trace_name, **summarize(result)})
            log.info("simulate.done signal=%s tasks=%d wall_s=%.1f", name, len(tasks), result.wall_s)
    return reports


def find_gpus(trace_name: str, traces_dir: str | None, gpus_spec: str, speedup: float | None,
              target_load: float | None, limit: int | None, seed: int, config: Config,
              sla_target: float, priority: int = 0, most: int = 256) -> dict[str, Any]:
    """The smallest pool of one GPU kind (``--gpus 1x80``) whose gpuq replay meets the SLA
    target at ``priority`` (handlers started, models loaded, within the SLA): doubling, then
    bisection (attainment grows with the pool, up to what cold starts leave; not at every
    point: a smaller pool between two sizes tried may meet it too, docs/SIMULATOR.md)."""
    if speedup is not None and target_load is not None:
        raise ConfigError("give --speedup or --target-load, not both")
    size = one_kind(gpus_spec, "--find-gpus")
    tasks, loads = read_trace(trace_name, traces_dir, seed, limit)
    # the compression is fixed by the trace alone (for one GPU), so every pool size sees the
    # same arrivals
    kept = replayable(trace_name, tasks, parse_gpus(f"1x{size:g}"), config)
    k = speedup if speedup is not None else speedup_for(kept, 1, load_for(target_load))
    _reachable(tasks, loads, sim_config(config), size, sla_target, priority)
    tried: dict[int, dict[str, Any]] = {}

    def meets(n: int) -> bool:
        if n not in tried:
            result = simulate(tasks, parse_gpus(f"{n}x{size:g}"), "gpuq", speedup=k,
                              load_time=loads.sample, seed=seed, config=config, server=server)
            tried[n] = summarize(result)
            log.info("simulate.find_gpus gpus=%d attainment=%s", n,
                     tried[n]["priorities"][f"P{priority}"]["sla_attainment"])
        attained = tried[n]["priorities"][f"P{priority}"]["sla_attainment"]
        return attained is not None and attained >= sla_target

    with replaying() as server:
        hi = 1
        while not meets(hi) and hi < most:
            hi = min(most, hi * 2)
        # none up to ``most`` met it: no smaller pool will
        lo = hi // 2 + 1 if hi > 1 and meets(hi) else hi
        while lo < hi:
            mid = (lo + hi) // 2
            if meets(mid):
                hi = mid
            else:
                lo = mid + 1
        found = meets(hi)
    return {"trace": trace_name, "gpu_gb": size, "speedup": k, "priority": f"P{priority}",
            "sla_target": sla_target, "gpus": hi if found else None,
            "tried": {n: r["priorities"][f"P{priority}"]["sla_attainment"] for n, r in sorted(tried.items())},
            "report": tried[hi]}


def _reachable(tasks: list[TraceTask], loads: traces.LoadTimes, config: Config, size: float,
               sla_target: float, priority: int) -> None:
    """Refuse a target no pool can meet: the first request of a model waits for its load."""
    kept = [Request(t.model, t.vram_gb, t.priority) for t in tasks
            if t.vram_gb <= size - config.kv_reserve_gb]  # as simulate refuses the rest
    sla = [config.sla_p0_s, config.sla_p1_s, config.sla_p2_s, None][priority]
    count = sum(1 for r in kept if r.priority == priority)
    if sla is None or not count:  # no target to search for: every size would "miss" it
        raise ConfigError(f"--sla-priority P{priority}: " + (
            "P3 has no SLA" if sla is None else f"the trace has no P{priority} task that fits a GPU"))
    missed = first_request_misses(kept, sla, priority, lambda m: min(
        loads.given.get(m) or [s * loads.scale(m) for s in loads.samples]))
    if (count - missed) / count < sla_target:
        raise ConfigError(f"--sla-target {sla_target:g} cannot be met at P{priority} by any pool: "
                          f"{missed} of its {count} tasks are their model's first request, whose "
                          f"load takes longer than the {sla:g} s SLA (at most "
                          f"{100 * (count - missed) / count:.1f}% within it)")


def tenant_figures(result: SimResult, tenant: str) -> dict[str, Any]:
    """One tenant's tasks in a replay: how many, arrival to handler start, within SLA."""
    return figures(result, [t for t in result.tasks if t.tenant == tenant])


def by_size(result: SimResult, large: list[str]) -> dict[str, Any]:
    """The 70B models' tasks (on two GPUs) and the others', as ``figures``."""
    chosen = set(large)
    return {"70b": figures(result, [t for t in result.tasks if t.model in chosen]),
            "other": figures(result, [t for t in result.tasks if t.model not in chosen])}


def figures(result: SimResult, tasks: list[SimTask]) -> dict[str, Any]:
    """Some tasks of a replay: how many, arrival to handler start, within SLA."""
    waits = [t.exec_s - t.arrival_s for t in tasks if t.exec_s is not None]
    timed = [t for t in tasks if result.sla_s[t.priority] is not None]
    met = sum(1 for t in timed if t.exec_s is not None
              and t.exec_s - t.arrival_s <= (result.sla_s[t.priority] or 0))
    p50, p99 = percentile(waits, 0.5), percentile(waits, 0.99)
    return {"tasks": len(tasks), "started": len(waits),
            "wait_p50_s": None if p50 is None else round(p50, 3),
            "wait_p99_s": None if p99 is None else round(p99, 3),
            "wait_mean_s": round(sum(waits) / len(waits), 3) if waits else None,
            "sla_attainment": round(met / len(timed), 4) if timed else None}
