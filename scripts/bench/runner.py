"""The whole run, phase by phase, on one Redis server started for it.

Each phase adds its headline figures to ``res`` (the keys of the --json output) and its
per-round and per-command breakdown to ``detail``. Rounds of the enqueue, drain and latency
phases are interleaved gpuq / minimal (/ BullMQ, when node is there) so the machine's noise
falls on each alike.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from bench import bullmq_side, gpuq_side, minimal_side, report, rq_side
from bench.bullmq_side import BullMQ
from bench.claim_latency import claim_latency, claim_pool
from bench.commands import accounting, server_time
from bench.common import Bench, Sizes, log, median
from bench.stats import Drain, Window, pct
from gpuq.embedded import EmbeddedServer

Res = dict[str, Any]


def run(sizes: Sizes, repeat: int) -> Res:
    """Start a server on a free port (never 6379), run every phase, stop the server."""
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuq-bench-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    server = EmbeddedServer("redis").start()
    if server.port == 6379:  # never the default port: that may be someone's real Redis
        server.stop()
        raise SystemExit("refusing to benchmark on port 6379")
    try:
        res = run_phases(Bench(server, sizes, repeat, log_dir))
    finally:
        server.stop()
    shutil.rmtree(log_dir, ignore_errors=True)  # the workers' logs, kept only when a run fails
    return res


def run_phases(b: Bench) -> Res:
    s = b.sizes
    t_start = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    info = b.r.info("server")
    res: Res = {}
    detail: Res = {}
    log(f"{b.server.kind} {info['redis_version']} on {b.url}; sizes {s}")
    bq, res["bullmq_skipped"] = bullmq_side.setup()
    if bq is None:
        log(f"bullmq: skipped ({res['bullmq_skipped']})")
    enq_windows = enqueue_phase(b, res, detail, bq)
    drain_windows = drain_phase(b, res, detail, bq)
    latency_phase(b, res, detail)
    commands_phase(b, res, detail, enq_windows, drain_windows, bq)
    log(f"server time per call: {s.accounting} enqueues, claims and acks per queue, each alone")
    detail["server_us"] = server_time(b, s.accounting)
    claim_phase(b, res, detail)
    res["ratios"] = report.ratios(res)
    res["targets"] = report.targets(res)
    res["detail"] = detail
    res["env"] = report.environment(b.server, info)
    res["env"]["bullmq"] = bq.version if bq else None
    res["env"]["node"] = bq.node_version if bq else None
    res["env"]["loadavg_start"] = load_start  # 1/5/15-minute load: other work on the machine
    res["env"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    res["sizes"] = s.__dict__
    res["repeat"] = b.repeat
    res["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    return res


def enqueue_phase(b: Bench, res: Res, detail: Res, bq: BullMQ | None) -> dict[str, list[Window]]:
    """Enqueue one by one and in bulk, gpuq and minimal (and BullMQ), interleaved; median of
    the rounds. Returns the first round's one-by-one windows (commands per task incl. Lua)."""
    s = b.sizes
    en: dict[str, list[tuple[float, float]]] = {k: [] for k in ("gpuq", "minimal", "gpuq_bulk",
                                                                   "minimal_bulk")}
    if bq is not None:
        en.update(bullmq=[], bullmq_bulk=[])
    windows: dict[str, list[Window]] = {"gpuq": [], "minimal": []}
    for i in range(b.repeat):
        log(f"enqueue one by one: {s.enqueue} tasks (round {i + 1}/{b.repeat})")
        en["gpuq"].append(gpuq_side.enqueue_one(b, s.enqueue, windows["gpuq"] if i == 0 else None))
        en["minimal"].append(minimal_side.enqueue_one(b, s.enqueue, windows["minimal"] if i == 0 else None))
        if bq is not None:
            en["bullmq"].append(bullmq_side.enqueue_one(bq, b, s.enqueue))
        log(f"enqueue bulk: {s.bulk} tasks in calls of {s.batch} (round {i + 1}/{b.repeat})")
        en["gpuq_bulk"].append(gpuq_side.enqueue_bulk(b, s.bulk))
        en["minimal_bulk"].append(minimal_side.enqueue_bulk(b, s.bulk))
        if bq is not None:
            en["bullmq_bulk"].append(bullmq_side.enqueue_bulk(bq, b, s.bulk))
    res["enqueue_per_s"] = round(median([x[0] for x in en["gpuq"]]), 1)
    res["minimal_enqueue_per_s"] = round(median([x[0] for x in en["minimal"]]), 1)
    res["bulk_enqueue_per_s"] = round(median([x[0] for x in en["gpuq_bulk"]]), 1)
    res["minimal_bulk_enqueue_per_s"] = round(median([x[0] for x in en["minimal_bulk"]]), 1)
    for k in ("bullmq", "bullmq_bulk"):
        res[f"{k}_enqueue_per_s"] = round(median([x[0] for x in en[k]]), 1) if bq else None
    detail["enqueue"] = {
        k: {"runs_per_s": [round(x[0], 1) for x in v],
            "client_cpu_us_per_task": round(median([x[1] for x in v]), 1)}
        for k, v in en.items()}
    for k in ("gpuq", "minimal"):
        w = windows[k][0]
        detail["enqueue"][k].update({
            "server_cpu_us_per_task": round(w.server_cpu_s / s.enqueue * 1e6, 1),
            "commands_per_task_incl_lua": round(w.total / s.enqueue, 2),
            "script_calls_per_task": round(w.calls("script") / s.enqueue, 3)})
    return windows


def drain_phase(b: Bench, res: Res, detail: Res, bq: BullMQ | None) -> dict[str, list[Window]]:
    """Claim+ack: one worker process drains a pre-filled queue, gpuq and minimal (and one
    BullMQ worker, concurrency 1) interleaved (median of the rounds), then one rq SimpleWorker."""
    s = b.sizes
    drains: dict[str, list[Drain]] = {"gpuq": [], "minimal": []}
    if bq is not None:
        drains["bullmq"] = []
    windows: dict[str, list[Window]] = {"gpuq": [], "minimal": []}
    for i in range(b.repeat):
        log(f"claim+ack: one gpuq burst worker drains {s.drain} no-op tasks (round {i + 1}/{b.repeat})")
        drains["gpuq"].append(gpuq_side.drain(b, s.drain, windows["gpuq"] if i == 0 else None))
        log(f"claim+ack: one minimal worker drains {s.drain} tasks (round {i + 1}/{b.repeat})")
        drains["minimal"].append(minimal_side.drain(b, s.drain, windows["minimal"] if i == 0 else None))
        if bq is not None:
            log(f"claim+ack: one BullMQ worker drains {s.drain} jobs (round {i + 1}/{b.repeat})")
            drains["bullmq"].append(bullmq_side.drain(bq, b, s.drain))
    res["claim_ack_per_s"] = round(median([d.rate for d in drains["gpuq"]]), 1)
    res["minimal_claim_ack_per_s"] = round(median([d.rate for d in drains["minimal"]]), 1)
    res["bullmq_drain_per_s"] = round(median([d.rate for d in drains["bullmq"]]), 1) if bq else None
    detail["drain"] = {k: [d.as_dict() for d in v] for k, v in drains.items()}
    if rq_side.HAVE_RQ:
        log(f"rq: one SimpleWorker drains {s.rq} jobs")
        rq = rq_side.drain(b, s.rq)
        res["rq_drain_per_s"] = round(rq.rate, 1)
        detail["drain"]["rq"] = [rq.as_dict()]
    else:
        log("rq is not installed (pip install 'gpuq[bench]'): its figures are skipped")
        res["rq_drain_per_s"] = None
    return windows


def latency_phase(b: Bench, res: Res, detail: Res) -> None:
    """Enqueue -> result against one idle worker process; samples pooled over the rounds."""
    s = b.sizes
    lat: dict[str, list[float]] = {"gpuq": [], "minimal": []}
    for i in range(b.repeat):
        log(f"latency: {s.latency} enqueue->result samples per queue (round {i + 1}/{b.repeat})")
        lat["gpuq"] += gpuq_side.latency(b, s.latency, s.latency_warmup)
        lat["minimal"] += minimal_side.latency(b, s.latency, s.latency_warmup)
    for k, prefix in (("gpuq", ""), ("minimal", "minimal_")):
        res[f"{prefix}latency_p50_ms"] = round(pct(lat[k], 50) * 1000, 3)
        res[f"{prefix}latency_p99_ms"] = round(pct(lat[k], 99) * 1000, 3)
    detail["latency"] = {k: {"samples": len(v), "mean_ms": round(statistics.fmean(v) * 1000, 3),
                             "p90_ms": round(pct(v, 90) * 1000, 3), "max_ms": round(max(v) * 1000, 3)}
                         for k, v in lat.items()}


def commands_phase(b: Bench, res: Res, detail: Res, enq_windows: dict[str, list[Window]],
                   drain_windows: dict[str, list[Window]], bq: BullMQ | None) -> None:
    """Commands per task: totals (Lua included) from INFO commandstats over the timed
    one-by-one enqueue and drain; the client / Lua split from a smaller MONITOR pass."""
    s = b.sizes
    for k, prefix in (("gpuq", ""), ("minimal", "minimal_")):
        incl = enq_windows[k][0].total / s.enqueue + drain_windows[k][0].total / s.drain
        res[f"{prefix}commands_per_task_incl_lua"] = round(incl, 2)
    log(f"commands: MONITOR pass, {s.accounting} tasks per queue (not timed)")
    acc = accounting(b, s.accounting, bq)
    detail["commands"] = acc
    res["commands_per_task"] = acc["gpuq"]["task_client"]
    res["minimal_commands_per_task"] = acc["minimal"]["task_client"]
    res["rq_commands_per_task"] = acc["rq"]["task_client"] if rq_side.HAVE_RQ else None
    res["rq_commands_per_task_incl_lua"] = acc["rq"]["task_total"] if rq_side.HAVE_RQ else None
    res["bullmq_commands_per_task"] = acc["bullmq"]["task_client"] if bq else None
    res["bullmq_commands_per_task_incl_lua"] = acc["bullmq"]["task_total"] if bq else None


def claim_phase(b: Bench, res: Res, detail: Res) -> None:
    """Claim round-trip latency with ``small`` and ``million`` tasks queued."""
    s = b.sizes
    log(f"claim latency: filling a pool with {s.small} tasks over {s.models} models")
    pools = [claim_pool(b, s.small, "1k")]
    if s.million > 0:
        log(f"claim latency: bulk-enqueueing {s.million} tasks over {s.models} models")
        pools.append(claim_pool(b, s.million, "1m"))
    log(f"claim latency: {s.claim_calls} timed claim calls per claimer and size, interleaved")
    claims = claim_latency(b, pools)
    for cp in pools:
        cp.close()
    detail["claim"] = claims
    res["claim_us_1k"] = claims["1k"]["cold"]["mean_us"]
    res["claim_us_1k_warm"] = claims["1k"]["warm"]["mean_us"]
    big = claims.get("1m")
    res["claim_us_1m"] = big["cold"]["mean_us"] if big else None
    res["claim_us_1m_warm"] = big["warm"]["mean_us"] if big else None
    res["million_size"] = s.million
    res["million_enqueue_s"] = big["fill_s"] if big else None
