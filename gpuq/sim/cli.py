"""What ``gpuq simulate`` runs: read the trace, size the compression, replay each policy."""

from __future__ import annotations

import logging
from typing import Any

from gpuq.config import Config
from gpuq.embedded import EmbeddedServer
from gpuq.errors import ConfigError
from gpuq.sim import traces
from gpuq.sim.policies import POLICIES
from gpuq.sim.report import summarize
from gpuq.sim.run import parse_gpus, simulate, speedup_for

log = logging.getLogger(__name__)


def run_simulations(trace_name: str, traces_dir: str | None, gpus_spec: str, speedup: float | None,
                    target_load: float | None, policy: str, limit: int | None, seed: int,
                    config: Config, plot_path: str | None = None) -> list[dict[str, Any]]:
    if speedup is not None and target_load is not None:
        raise ConfigError("give --speedup or --target-load, not both")
    if limit is not None and limit < 1:
        raise ConfigError("--limit must be >= 1")
    gpus = parse_gpus(gpus_spec)
    try:
        tasks = traces.read(trace_name, traces_dir, seed=seed, limit=limit)
        loads = traces.LoadTimes.from_trace(traces_dir)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(str(exc)) from None
    if not tasks:
        raise ConfigError(f"trace {trace_name!r} has no tasks to replay")
    if speedup is None:
        speedup = speedup_for(tasks, len(gpus), 0.8 if target_load is None else target_load)
    policies = list(POLICIES) if policy == "all" else [policy]
    results, reports = [], []
    server = EmbeddedServer("redis").start()  # one server for every policy's replay
    planner = logging.getLogger("gpuq.reaper")
    level = planner.level
    planner.setLevel(max(logging.WARNING, planner.getEffectiveLevel()))  # thousands of decisions
    try:
        for name in policies:
            result = simulate(tasks, gpus, name, speedup=speedup,
                              load_time=loads.sample, seed=seed, config=config, server=server)
            results.append(result)
            reports.append({"trace": trace_name, **summarize(result)})
            log.info("simulate.done policy=%s tasks=%d wall_s=%.1f", name, len(tasks), result.wall_s)
    finally:
        planner.setLevel(level)
        server.stop()
    if plot_path:
        from gpuq.sim.plot import plot

        plot(results, plot_path)
    return reports
