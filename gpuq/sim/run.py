"""One simulation: a trace, a pool of GPUs, a policy, a time compression; the real scripts on
an embedded server of its own (never a server of yours)."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import replace

from gpuq import task
from gpuq.client import Queue
from gpuq.config import Config
from gpuq.connection import connect
from gpuq.embedded import EmbeddedServer
from gpuq.errors import ConfigError
from gpuq.sim.autoscale import Autoscale
from gpuq.sim.engine import Engine
from gpuq.sim.model import SimResult, TraceTask, devices_of
from gpuq.sim.policies import POLICIES, GpuqScheduler, QueueScheduler, Scheduler
from gpuq.tenants import Tenant, set_tenant
from gpuq.worker.gpu import MAX_DECLARED_GB

LoadSampler = Callable[[str, random.Random], float]  # (model, rng) -> seconds
MAX_GPUS = 4096  # GPUs one replay simulates, in all: past any pool it sizes, short of a runaway


def parse_gpus(spec: str) -> list[tuple[str, float]]:
    """"4x80,2x48,1x24/01,2x4x80" -> worker ids and VRAM (GB; a group's: every device's).
    COUNTxGB is COUNT one-GPU workers; COUNTxDEVICESxGB is COUNT workers, each a group of
    DEVICES GPUs of GB each (ids "gpu4x80-0": the id carries the group, ``devices_of``).
    A "/LEVELS" suffix makes them a dedicated lane serving only those priorities (e.g. /01:
    P0 and P1); the levels are carried in the worker id ("gpu24-0@01"). At most MAX_GPUS
    GPUs in all, counted before each part's workers are made."""
    gpus: list[tuple[str, float]] = []
    total = 0
    made: dict[str, int] = {}  # workers of each kind so far: ids stay unique
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(?:(\d+)\s*[xX]\s*)?(\d+(?:\.\d+)?)\s*(?:/([0-3]+))?\s*",
                         part)
        # a group and its GB per GPU as a worker may declare them (claim refuses more VRAM)
        if (not m or int(m.group(1)) < 1 or not 1 <= int(m.group(2) or 1) <= task.MAX_GPUS
                or not 0 < float(m.group(3)) <= MAX_DECLARED_GB):
            raise ConfigError(f"--gpus {spec!r}: use COUNTx[GPUSx]GB[/LEVELS][,...], "
                              f"e.g. 4x80,2x24/01,2x4x80 (groups of 1..{task.MAX_GPUS} GPUs, "
                              f"at most {MAX_DECLARED_GB:g} GB each)")
        count, devices, size = int(m.group(1)), int(m.group(2) or 1), float(m.group(3))
        total += count * devices
        if total > MAX_GPUS:
            raise ConfigError(f"--gpus {spec!r}: {total} GPUs; a replay simulates at most {MAX_GPUS}")
        lane = "".join(sorted(set(m.group(4)))) if m.group(4) else ""
        kind = f"gpu{size:g}" if devices == 1 else f"gpu{devices}x{size:g}"
        suffix = f"@{lane}" if lane else ""
        start = made.get(kind + suffix, 0)
        made[kind + suffix] = start + count
        gpus += [(f"{kind}-{start + i}{suffix}", size * devices) for i in range(count)]
    return gpus


def speedup_for(tasks: list[TraceTask], gpus: int, target_load: float) -> float:
    """The compression that makes offered work ``target_load`` of the pool's capacity."""
    work = sum(t.service_s for t in tasks)
    span = max((t.arrival_s for t in tasks), default=0.0) - min((t.arrival_s for t in tasks), default=0.0)
    if work <= 0 or span <= 0:
        return 1.0
    return target_load * gpus * span / work


def sim_config(base: Config | None = None) -> Config:
    """The pool's settings for a replay: leases outlive the run (simulated workers never die,
    and nothing renews them on a virtual clock), and no autoscaler hook runs."""
    return replace(base or Config(), pool="sim", lease_s=10 * 365 * 86400.0, heartbeat_s=5.0,
                   on_scale="").validate()


def autoscaled_config(config: Config, autoscale: Autoscale, speedup: float) -> Config:
    """The pool's settings under an autoscaler: its minimum is the pool's, the forecast's
    day is the compressed day, and its lead is the boot time (what the reaper cannot know)."""
    return replace(config, min_workers=autoscale.min, forecast_day_s=config.forecast_day_s / speedup,
                   forecast_lead_s=autoscale.boot_s).validate()


def fitting(tasks: Sequence[TraceTask], gpus: Sequence[tuple[str, float]],
            config: Config, tenants: Sequence[Tenant] = ()) -> list[TraceTask]:
    """The tasks some worker of ``gpus`` could hold, whose deadline their own estimate can
    meet and whose tenant's caps (of ``tenants``) could let them run; the rest are refused up
    front, as enqueue's fit check (and its deadline and caps checks) would (a plain FIFO
    would otherwise block behind one forever), for every policy alike. config: the
    replay's (``sim_config``), whose ``kv_reserve_gb`` each GPU keeps back."""
    caps = {t.name: t for t in tenants}
    usable: dict[int, float] = {}  # group size -> the most VRAM a worker of that size offers
    for w, gb in gpus:
        n = devices_of(w)
        usable[n] = max(usable.get(n, 0.0), gb - config.kv_reserve_gb * n)
    return [t for t in tasks if any(n >= t.gpus and t.vram_gb <= gb for n, gb in usable.items())
            and not (t.deadline_s is not None and t.est_s > t.deadline_s)
            and not (t.tenant in caps and caps[t.tenant].past_caps(t.gpus, t.vram_gb))]


MAX_SPAN_S = 1e11  # virtual seconds a replay may run: EPOCH_MS + this stays within 1e15 ms


def simulate(tasks: list[TraceTask], gpus: list[tuple[str, float]], policy: str, *,
             speedup: float, load_time: LoadSampler, seed: int = 1,
             config: Config | None = None, server: EmbeddedServer | None = None,
             skip_ahead: bool = True, autoscale: Autoscale | None = None,
             tenants: Sequence[Tenant] = (), warm_hints: bool = False) -> SimResult:
    """skip_ahead=False runs every reaper round and every claim, and every round's scale step
    (the same report, slower).
    autoscale: GPUs of one class come and go (``gpus`` is then ignored; gpuq only).
    tenants: registered before a gpuq replay (weights and caps apply; the baselines have no
    tenants). warm_hints: a fixed pool's GPUs take the reaper's warm hints (gpuq.sim.hints;
    off by default: the full GenAI replay takes about 3x as long)."""
    if policy not in POLICIES:
        raise ConfigError(f"--policy {policy!r}: one of {', '.join(POLICIES)}")
    if speedup <= 0:
        raise ConfigError("--speedup must be > 0")
    cfg = sim_config(config)
    if autoscale is not None:
        if policy != "gpuq":
            raise ConfigError("--autoscale replays the gpuq policy only")
        cfg = autoscaled_config(cfg, autoscale, speedup)
        gpus = [(autoscale.gpu_id(0), autoscale.gb)]  # the size the fit check below uses
    kept = fitting(tasks, gpus, cfg, tenants)
    first = min((t.arrival_s for t in kept), default=0.0)
    compressed = [replace(t, arrival_s=(t.arrival_s - first) / speedup) for t in kept]
    span_s = max((t.arrival_s + t.service_s / speedup for t in compressed), default=0.0)
    if span_s > MAX_SPAN_S:  # the scripts' clock takes epoch ms up to 1e15
        raise ConfigError(f"the trace spans {span_s:.3g} s at speedup {speedup:g}: more than a "
                          f"replay's clock holds ({MAX_SPAN_S:g} s)")
    rng = random.Random(seed)
    own = server is None
    srv = server or EmbeddedServer("redis").start()
    try:
        scheduler: Scheduler
        if policy == "gpuq":
            client = connect(srv.url)
            client.flushdb()
            for tenant in tenants:
                set_tenant(Queue(client, cfg), tenant)
            scheduler = GpuqScheduler(client, cfg)
        else:
            scheduler = QueueScheduler(policy, {f"t{i:06d}": t for i, t in enumerate(compressed)})
        engine = Engine(scheduler, gpus, compressed, lambda model: load_time(model, rng), cfg, autoscale)
        engine.rounds.skip_ahead = skip_ahead
        # room for tenants' demand needs two tenants with work: rounds every second only then
        engine.rounds.tenancy = (policy == "gpuq" and bool(tenants)
                                 and len({t.tenant for t in compressed}) > 1)
        engine.steps.on = engine.steps.on and warm_hints
        engine.steps.every_round = not skip_ahead
        result = engine.run()
        if policy == "gpuq":
            client.close()
    finally:
        if own:
            srv.stop()
    result.speedup = speedup
    result.rejected = len(tasks) - len(kept)
    return result
