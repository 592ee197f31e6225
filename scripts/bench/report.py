"""The run's verdict and its presentation: ratios, the issue's targets, environment, table."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import hiredis
import redis

import gpuq
from bench import ROOT
from bench.rq_side import RQ_VERSION
from gpuq.embedded import EmbeddedServer


def ratio(a: Any, b: Any) -> float | None:
    if a is None or b is None or not b:
        return None
    return round(float(a) / float(b), 3)


def ratios(res: dict[str, Any]) -> dict[str, Any]:
    return {
        "enqueue_vs_minimal": ratio(res["enqueue_per_s"], res["minimal_enqueue_per_s"]),
        "bulk_enqueue_vs_minimal": ratio(res["bulk_enqueue_per_s"], res["minimal_bulk_enqueue_per_s"]),
        "claim_ack_vs_minimal": ratio(res["claim_ack_per_s"], res["minimal_claim_ack_per_s"]),
        "latency_p50_vs_minimal": ratio(res["latency_p50_ms"], res["minimal_latency_p50_ms"]),
        "latency_p99_vs_minimal": ratio(res["latency_p99_ms"], res["minimal_latency_p99_ms"]),
        "commands_per_task_vs_minimal": ratio(res["commands_per_task"], res["minimal_commands_per_task"]),
        "commands_per_task_incl_lua_vs_minimal": ratio(res["commands_per_task_incl_lua"],
                                                       res["minimal_commands_per_task_incl_lua"]),
        "claim_ack_vs_rq": ratio(res["claim_ack_per_s"], res["rq_drain_per_s"]),
        "claim_1m_vs_1k": ratio(res["claim_us_1m"], res["claim_us_1k"]),
        "claim_1m_vs_1k_warm": ratio(res["claim_us_1m_warm"], res["claim_us_1k_warm"]),
        "enqueue_vs_bullmq": ratio(res["enqueue_per_s"], res["bullmq_enqueue_per_s"]),
        "bulk_enqueue_vs_bullmq": ratio(res["bulk_enqueue_per_s"], res["bullmq_bulk_enqueue_per_s"]),
        "claim_ack_vs_bullmq": ratio(res["claim_ack_per_s"], res["bullmq_drain_per_s"]),
        "commands_per_task_vs_bullmq": ratio(res["commands_per_task"], res["bullmq_commands_per_task"]),
        "commands_per_task_incl_lua_vs_bullmq": ratio(res["commands_per_task_incl_lua"],
                                                      res["bullmq_commands_per_task_incl_lua"]),
    }


def _at_least(x: float | None, bound: float) -> bool | None:
    return None if x is None else x >= bound


def _at_most(x: float | None, bound: float) -> bool | None:
    return None if x is None else x <= bound


def targets(res: dict[str, Any]) -> dict[str, bool | None]:
    """The issues' bars: within 10% of the minimal queue on each figure, >= 10x rq, 1M <= 1.5x
    1k, a single worker's drain >= 1.1x BullMQ's."""
    q = res["ratios"]
    return {
        "enqueue_within_10pct_of_minimal": _at_least(q["enqueue_vs_minimal"], 0.9),
        "bulk_enqueue_within_10pct_of_minimal": _at_least(q["bulk_enqueue_vs_minimal"], 0.9),
        "claim_ack_within_10pct_of_minimal": _at_least(q["claim_ack_vs_minimal"], 0.9),
        "latency_p50_within_10pct_of_minimal": _at_most(q["latency_p50_vs_minimal"], 1.1),
        "latency_p99_within_10pct_of_minimal": _at_most(q["latency_p99_vs_minimal"], 1.1),
        "commands_per_task_within_10pct_of_minimal": _at_most(q["commands_per_task_vs_minimal"], 1.1),
        "claim_ack_at_least_10x_rq": _at_least(q["claim_ack_vs_rq"], 10.0),
        "claim_1m_within_1_5x_of_1k": _at_most(q["claim_1m_vs_1k"], 1.5),
        "claim_ack_at_least_1_1x_bullmq": _at_least(q["claim_ack_vs_bullmq"], 1.1),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _memory_gb() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        return None


def _git_state() -> str:
    """The commit, marked when gpuq/ or workers/ has uncommitted changes to tracked files."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "gpuq", "workers"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{'+uncommitted changes in gpuq/' if dirty else ''}" if head else "unknown"


def _sources_digest() -> str:
    """A hash of gpuq/ and workers/ (.py and .lua): which code the figures belong to."""
    digest = hashlib.sha256()
    for pkg in ("gpuq", "workers"):
        for f in sorted((ROOT / pkg).rglob("*")):
            if f.is_file() and f.suffix in (".py", ".lua"):
                digest.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def environment(server: EmbeddedServer, info: dict[str, Any]) -> dict[str, Any]:
    return {"server": f"{server.kind} {info['redis_version']}", "python": platform.python_version(),
            "gpuq_git": _git_state(), "gpuq_from": str(Path(gpuq.__file__).parent),
            "gpuq_sources_sha256": _sources_digest(),
            "redis_py": redis.__version__, "hiredis": hiredis.__version__, "rq": RQ_VERSION,
            "hiredis_parser": bool(getattr(redis.utils, "HIREDIS_AVAILABLE", False)),
            "cpus": os.cpu_count(), "cpu": _cpu_model(), "memory_gb": _memory_gb(),
            "platform": platform.platform()}


def _f(v: Any, nd: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and nd:
        return f"{v:,.{nd}f}"
    return f"{v:,.0f}" if isinstance(v, (int, float)) else str(v)


Row = tuple[str, str, str, str, float | None, float | None, str, float | None]


def _rows(res: dict[str, Any]) -> list[Row]:
    """(figure, gpuq, minimal, rq, gpuq/minimal, gpuq/rq, BullMQ, gpuq/BullMQ) per line."""
    q = res["ratios"]
    return [
        ("enqueue/s, one by one", _f(res["enqueue_per_s"]), _f(res["minimal_enqueue_per_s"]), "-",
         q["enqueue_vs_minimal"], None, _f(res["bullmq_enqueue_per_s"]), q["enqueue_vs_bullmq"]),
        ("enqueue/s, bulk", _f(res["bulk_enqueue_per_s"]), _f(res["minimal_bulk_enqueue_per_s"]), "-",
         q["bulk_enqueue_vs_minimal"], None, _f(res["bullmq_bulk_enqueue_per_s"]),
         q["bulk_enqueue_vs_bullmq"]),
        ("claim+ack/s, 1 worker, no-op", _f(res["claim_ack_per_s"]), _f(res["minimal_claim_ack_per_s"]),
         _f(res["rq_drain_per_s"]), q["claim_ack_vs_minimal"], q["claim_ack_vs_rq"],
         _f(res["bullmq_drain_per_s"]), q["claim_ack_vs_bullmq"]),
        ("enqueue->result p50 ms", _f(res["latency_p50_ms"], 2), _f(res["minimal_latency_p50_ms"], 2),
         "-", q["latency_p50_vs_minimal"], None, "-", None),
        ("enqueue->result p99 ms", _f(res["latency_p99_ms"], 2), _f(res["minimal_latency_p99_ms"], 2),
         "-", q["latency_p99_vs_minimal"], None, "-", None),
        ("commands/task, client", _f(res["commands_per_task"], 2), _f(res["minimal_commands_per_task"], 2),
         _f(res["rq_commands_per_task"], 2), q["commands_per_task_vs_minimal"],
         ratio(res["commands_per_task"], res["rq_commands_per_task"]),
         _f(res["bullmq_commands_per_task"], 2), q["commands_per_task_vs_bullmq"]),
        ("commands/task, incl. Lua", _f(res["commands_per_task_incl_lua"], 2),
         _f(res["minimal_commands_per_task_incl_lua"], 2), _f(res["rq_commands_per_task_incl_lua"], 2),
         q["commands_per_task_incl_lua_vs_minimal"],
         ratio(res["commands_per_task_incl_lua"], res["rq_commands_per_task_incl_lua"]),
         _f(res["bullmq_commands_per_task_incl_lua"], 2), q["commands_per_task_incl_lua_vs_bullmq"]),
    ]


def _r(x: float | None, nd: int) -> str:
    return _f(x, nd) if x is not None else "-"


def table(res: dict[str, Any]) -> str:
    """The run as a plain-text table: side by side, claim latency, targets, environment.
    Without BullMQ its two columns and target are left out and one line says why."""
    bull = not res["bullmq_skipped"]
    head = f"{'figure':<32}{'gpuq':>12}{'minimal':>12}{'rq':>10}{'gpuq/min':>10}{'gpuq/rq':>9}"
    head += f"{'bullmq':>10}{'gpuq/bull':>11}" if bull else ""
    lines = [head, "-" * len(head)]
    for name, g, m, r, a, b, bm, c in _rows(res):
        lines.append(f"{name:<32}{g:>12}{m:>12}{r:>10}{_r(a, 3):>10}{_r(b, 2):>9}"
                     + (f"{bm:>10}{_r(c, 3):>11}" if bull else ""))
    if not bull:
        lines.append(f"bullmq: skipped ({res['bullmq_skipped']})")
    lines.append("")
    q = res["ratios"]
    small, big = res["sizes"]["small"], res["million_size"]
    for label, suffix in (("cold", ""), ("warm", "_warm")):
        lines.append(f"claim µs/call ({label} worker)  @{small:,}: {_f(res['claim_us_1k' + suffix], 1)}"
                     f"   @{big:,}: {_f(res['claim_us_1m' + suffix], 1)}"
                     f"   ratio {_f(q['claim_1m_vs_1k' + suffix], 3)}")
    if res["million_enqueue_s"] is not None:
        lines.append(f"bulk enqueue of {big:,} tasks over {res['sizes']['models']} models: "
                     f"{res['million_enqueue_s']} s")
    lines += ["", "targets:"]
    for k, v in res["targets"].items():
        if k.endswith("bullmq") and not bull:
            continue
        lines.append(f"  {k:<46} {'met' if v else ('n/a' if v is None else 'NOT met')}")
    e = res["env"]
    lines += ["", f"{e['server']}, python {e['python']}, redis-py {e['redis_py']} (hiredis {e['hiredis']}), "
              f"rq {e['rq']}, " + (f"bullmq {e['bullmq']} (node {e['node']}), " if bull else "")
              + f"{e['cpus']} CPUs, {res['elapsed_s']} s"]
    return "\n".join(lines)
