"""Trace readers: the shared replay traces turned into :class:`~gpuq.sim.model.TraceTask` lists.

``read("genai")`` returns the Alibaba GenAI Stable-Diffusion requests, sorted by arrival, with
uncompressed ``arrival_s`` (the engine divides by its speedup); ``read("my.csv")`` reads a file:
one of these traces, known by its header, or the user's own requests (``gpuq.sim.trace_csv``).
Fields a trace lacks (VRAM, priority, the producer's estimate) are derived deterministically
from ``seed`` with stable hashes (``zlib.crc32``, never ``hash()``); docs/SIMULATOR.md
("Traces") documents every mapping, assumption and skipped row. The named traces are read from
``GPUQ_TRACES``, else ``<repo>/../shared/traces``; nothing is copied into the repository.
:class:`LoadTimes` samples model load latencies.
"""

from __future__ import annotations

import logging
import math
import os
import random
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import gpuq
from gpuq.errors import InvalidTask
from gpuq.sim import trace_csv, traces_llm
from gpuq.sim.model import TraceTask

log = logging.getLogger(__name__)

TRACES: dict[str, str] = {
    "genai": "alibaba_genai2026_sd_requests.csv.gz",
    "openb": "alibaba_gpu2023_openb_jobs.csv.gz",
    "azure": "azure_llm_2023_code_conv.csv.gz",
    "mooncake": "mooncake_fast25_conversation.csv.gz",
}
# each trace's columns (shared/traces/README.md): a file with exactly these is read as that trace
REQUEST_COLUMNS = ("arrival_s", "model", "input_tokens", "output_tokens", "service_s")
HEADERS: dict[str, tuple[str, ...]] = {
    "genai": (*REQUEST_COLUMNS, "task", "status", "tenant", "num_lora", "num_images", "num_steps",
              "prompt_chars"),
    "openb": ("arrival_s", "job", "runtime_s", "lifetime_s", "wait_s", "num_gpus", "gpu_frac",
              "gpu_mem_gb", "cpu_cores", "mem_gb", "qos", "priority", "phase", "preexisting", "censored"),
    "azure": REQUEST_COLUMNS,
    "mooncake": (*REQUEST_COLUMNS, "n_blocks", "reused_blocks", "parent_req"),
}
LOAD_LATENCY_FILE = "alibaba_genai2026_model_load_latency.csv.gz"
DEFAULT_DIR = Path(gpuq.__file__).resolve().parents[2] / "shared" / "traces"
ENV_VAR = "GPUQ_TRACES"

TIER_SHARES = (0.20, 0.30, 0.30, 0.20)  # P0..P3 shares of hashed keys (tenants, sessions)
# Stable-Diffusion serving pod memory: lognormal with median 24.8 GB and p99 39.6 GB
# (z = 2.326 at p99), clipped to [8, 40] GB.
SD_VRAM_MEDIAN_GB, SD_VRAM_P99_GB, SD_VRAM_RANGE_GB = 24.8, 39.6, (8.0, 40.0)
OPENB_MIN_VRAM_GB = 1.0

Rows = Iterable[dict[str, str]]


@dataclass(frozen=True)
class TraceRead:
    """One trace read: its tasks and why the other rows were left out."""

    name: str
    path: Path
    rows: int  # data rows in the file
    tasks: list[TraceTask]
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows
    load_s: dict[str, tuple[float, ...]] = field(default_factory=dict)  # model -> given loads


def trace_dir(path: Path | str | None = None) -> Path:
    """The trace directory: ``path``, else ``$GPUQ_TRACES``, else ``<repo>/../shared/traces``."""
    env = os.environ.get(ENV_VAR)
    directory = Path(path) if path is not None else Path(env) if env else DEFAULT_DIR
    if not directory.is_dir():
        raise FileNotFoundError(
            f"trace directory {directory} not found: pass --traces-dir or set {ENV_VAR} to the folder "
            f"holding {', '.join(sorted({*TRACES.values(), LOAD_LATENCY_FILE}))}"
        )
    return directory


def trace_path(name: str, path: Path | str | None = None) -> Path:
    """The file of trace ``name``; ``path`` may be the file itself or its directory."""
    if name not in TRACES:
        if "/" in name or name.endswith((".csv", ".csv.gz")):  # meant as a file
            what = "is a directory, not a CSV file" if Path(name).is_dir() else "not found"
            raise FileNotFoundError(f"trace file {name} {what}")
        raise ValueError(f"unknown trace {name!r}; known traces: {', '.join(sorted(TRACES))}; "
                         "or the path of a CSV file")
    return _locate(TRACES[name], path)


def _locate(file_name: str, path: Path | str | None) -> Path:
    if path is not None and Path(path).is_file():
        return Path(path)
    file = trace_dir(path) / file_name
    if not file.is_file():
        raise FileNotFoundError(f"trace file {file} not found (pass --traces-dir or set {ENV_VAR})")
    return file


def known_format(file: Path) -> str | None:
    """The trace of :data:`TRACES` whose columns the file has, exactly; None: another CSV."""
    columns = set(trace_csv.header(file))
    return next((name for name, names in HEADERS.items() if columns == set(names)), None)


def tier(key: str, seed: int) -> int:
    """A stable priority 0..3 for ``key`` (a tenant, a session), with :data:`TIER_SHARES`."""
    u = zlib.crc32(f"tier:{seed}:{key}".encode()) / 2**32
    edge = 0.0
    for priority, share in enumerate(TIER_SHARES):
        edge += share
        if u < edge:
            return priority
    return len(TIER_SHARES) - 1


def sd_vram_gb(model: str, seed: int) -> float:
    """A diffusion model's VRAM: one seeded lognormal draw per (model, seed)."""
    sigma = math.log(SD_VRAM_P99_GB / SD_VRAM_MEDIAN_GB) / 2.326
    rng = random.Random(zlib.crc32(f"vram:{seed}:{model}".encode()))
    low, high = SD_VRAM_RANGE_GB
    return round(min(max(rng.lognormvariate(math.log(SD_VRAM_MEDIAN_GB), sigma), low), high), 1)


def _genai_skip(row: dict[str, str]) -> str | None:
    if row["status"] == "PENDING":
        return "pending"
    if not row["model"]:
        return "no model"
    if not row["service_s"] or float(row["service_s"]) <= 0:
        return "no service time"
    return None


def _genai(rows: Rows, seed: int) -> tuple[list[TraceTask], Counter[str]]:
    skipped: Counter[str] = Counter()
    kept: list[dict[str, str]] = []
    total: defaultdict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    for row in rows:
        reason = _genai_skip(row)
        if reason:
            skipped[reason] += 1
            continue
        kept.append(row)
        total[row["model"]] += float(row["service_s"])
        count[row["model"]] += 1
    vram = {m: sd_vram_gb(m, seed) for m in count}
    tiers = {t: tier(t, seed) for t in {r["tenant"] for r in kept}}
    tasks = []
    for row in kept:
        model, priority = row["model"], tiers[row["tenant"]]
        tasks.append(TraceTask(
            arrival_s=float(row["arrival_s"]),
            model=model,
            vram_gb=vram[model],
            priority=priority,
            service_s=float(row["service_s"]),
            est_s=total[model] / count[model],  # the model's typical latency, not this request's
            preemptible=priority >= 2,
            tenant=row["tenant"],
        ))
    return tasks, skipped


def _openb_skip(row: dict[str, str]) -> str | None:
    gpus = int(row["num_gpus"])
    if gpus == 0:
        return "cpu only"
    if gpus > 1:
        return "multi-gpu"
    if not row["runtime_s"] or float(row["runtime_s"]) <= 0:
        return "never scheduled"
    return None


def _openb(rows: Rows, seed: int) -> tuple[list[TraceTask], Counter[str]]:
    del seed  # nothing is drawn: every field comes from the trace
    skipped: Counter[str] = Counter()
    tasks = []
    for row in rows:
        reason = _openb_skip(row)
        if reason:
            skipped[reason] += 1
            continue
        priority = int(row["priority"].removeprefix("P"))
        runtime_s = float(row["runtime_s"])
        tasks.append(TraceTask(
            arrival_s=float(row["arrival_s"]),
            model=f"openb-{row['qos'].lower()}",  # no model in the trace: one per QoS class
            vram_gb=max(float(row["gpu_mem_gb"]), OPENB_MIN_VRAM_GB),
            priority=priority,
            service_s=runtime_s,
            est_s=runtime_s,
            preemptible=priority >= 2,
        ))
    return tasks, skipped


_READERS: dict[str, Callable[[Rows, int], tuple[list[TraceTask], Counter[str]]]] = {
    "genai": _genai,
    "openb": _openb,
    "azure": lambda rows, seed: traces_llm.azure(rows),
    "mooncake": lambda rows, seed: traces_llm.mooncake(rows, lambda key: tier(key, seed)),
}


def read_trace(
    name: str, path: Path | str | None = None, *, seed: int = 1, limit: int | None = None
) -> TraceRead:
    """Read trace ``name`` (one of :data:`TRACES`, else a CSV file): tasks sorted by arrival
    (the first ``limit`` of them), skip counts, and the load times a CSV of one's own gives."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    given: dict[str, tuple[float, ...]] = {}
    if name not in TRACES and Path(name).is_file():
        file = Path(name)
        known = known_format(file)
        if known is None:
            tasks, given = trace_csv.read(file)
            skipped: Counter[str] = Counter()
        else:
            tasks, skipped = _read_known(known, file, seed)
    else:
        file = trace_path(name, path)
        tasks, skipped = _READERS[name](trace_csv.records(file), seed)
    rows = len(tasks) + sum(skipped.values())  # every reader keeps or skips each row
    tasks.sort(key=lambda t: t.arrival_s)  # stable: ties keep the file's order
    # rows left out are said where a replay's reader sees them (docs/SIMULATOR.md, Traces)
    log.log(logging.INFO if skipped else logging.DEBUG, "trace.read name=%s rows=%d tasks=%d skipped=%s",
            name, rows, len(tasks), ", ".join(f"{n} {why}" for why, n in sorted(skipped.items())) or "none")
    return TraceRead(name, file, rows, tasks[:limit], dict(skipped), given)


def _read_known(name: str, file: Path, seed: int) -> tuple[list[TraceTask], Counter[str]]:
    """A file of trace ``name`` found by its header: a value its reader cannot take is an
    error naming the file, not a stack trace."""
    at = [0]
    try:
        tasks, skipped = _READERS[name](trace_csv.records(file, at), seed)
        at[0] = 0  # read: a task's check below names no line
        for task in tasks:
            trace_csv.check(task)
    except (KeyError, ValueError, InvalidTask) as exc:
        why = (exc.reason if isinstance(exc, InvalidTask) else f"no value in column {exc}"
               if isinstance(exc, KeyError) else str(exc))
        where = f" line {at[0]}" if at[0] else ""
        raise ValueError(f"{file}{where} has the columns of the {name} trace, but is not a row "
                         f"of it: {why}") from None
    return tasks, skipped


def read(
    name: str, path: Path | str | None = None, *, seed: int = 1, limit: int | None = None
) -> list[TraceTask]:
    """The tasks of trace ``name`` (one of :data:`TRACES`), sorted by uncompressed arrival."""
    return read_trace(name, path, seed=seed, limit=limit).tasks


def offered_gpu_seconds(tasks: Sequence[TraceTask]) -> float:
    """GPU-seconds of work the tasks ask for (the sum of their service times)."""
    return sum(t.service_s for t in tasks)


def span_s(tasks: Sequence[TraceTask]) -> float:
    """Seconds from the first arrival to the last (uncompressed); 0 for fewer than two tasks."""
    if len(tasks) < 2:
        return 0.0
    return max(t.arrival_s for t in tasks) - min(t.arrival_s for t in tasks)


class LoadTimes:
    """Model load latencies: measured base-model loads, scaled up for LLM-sized weights; or,
    for a model a trace gives load times of (``given``), those."""

    def __init__(self, samples: Sequence[float], scales: Mapping[str, float] | None = None,
                 given: Mapping[str, Sequence[float]] | None = None) -> None:
        self.given = {model: tuple(loads) for model, loads in (given or {}).items() if loads}
        if not samples and not self.given:
            raise ValueError("LoadTimes needs at least one latency sample")
        self.samples = tuple(samples)
        default = {model: cost.load_scale for model, cost in traces_llm.COSTS.items()}
        self.scales = dict(default if scales is None else scales)

    @classmethod
    def from_trace(cls, path: Path | str | None = None, *, kind: str = "base_model_load") -> LoadTimes:
        """The ``kind`` rows of the load-latency trace (``path``: the file or its directory)."""
        file = _locate(LOAD_LATENCY_FILE, path)
        samples = [float(r["latency_s"]) for r in trace_csv.records(file) if r["kind"] == kind]
        if not samples:
            raise ValueError(f"no {kind!r} rows in {file}")
        return cls(samples)

    @classmethod
    def for_trace(cls, read: TraceRead, path: Path | str | None = None) -> LoadTimes:
        """The loads of the trace's models: those it gives, the measured ones for the rest (the
        load-latency trace, ``path`` as for :meth:`from_trace`, is needed only for those)."""
        rest = sorted({t.model for t in read.tasks} - set(read.load_s))
        if not rest:
            return cls((), given=read.load_s)
        try:
            measured = cls.from_trace(path)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{read.name} gives no load_s for model {rest[0]}"
                                    f"{f' and {len(rest) - 1} more' if len(rest) > 1 else ''}, "
                                    f"and the measured load times are not there: {exc}") from None
        return cls(measured.samples, measured.scales, read.load_s)

    def scale(self, model: str) -> float:
        return self.scales.get(model, 1.0)

    def sample(self, model: str, rng: random.Random) -> float:
        """One load of ``model``: one of its given loads, else a measured latency times the
        model's scale, drawn with ``rng``."""
        if model in self.given:
            return rng.choice(self.given[model])
        return rng.choice(self.samples) * self.scale(model)

    def sampler(self, seed: int) -> Callable[[str], float]:
        """``model -> seconds`` for the engine: :meth:`sample` with its own ``Random(seed)``."""
        rng = random.Random(seed)
        return lambda model: self.sample(model, rng)

    def mean_s(self, model: str | None = None) -> float:
        """The mean load time (of ``model``, scale included; of a base checkpoint if None)."""
        if model in self.given:
            return sum(self.given[model]) / len(self.given[model])
        return sum(self.samples) / len(self.samples) * (1.0 if model is None else self.scale(model))
