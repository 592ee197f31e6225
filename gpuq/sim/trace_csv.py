"""Your own traffic as a trace: a CSV of requests, plain or gzip'd (``gpuq simulate --trace FILE``).

One row is one request. Columns are found by their header name, in any order; other columns
are ignored. Every value is checked as enqueue would check it (``TaskSpec.build``), and the
first bad one is an error naming its line, so a replay never starts on half a file.

| column | | meaning |
| --- | --- | --- |
| ``arrival_s`` | required | seconds (from the start, or an epoch) or an ISO 8601 time |
| ``model`` | required | the model the request needs |
| ``priority`` | required | P0..P3, 0..3 or online/nearline/batch/offline |
| ``service_s`` | required | run time once its model is loaded, seconds |
| ``vram_gb`` | optional | its whole VRAM need, weights included (else :data:`DEFAULT_VRAM_GB`) |
| ``est_s`` | optional | the producer's estimate (else the model's mean ``service_s``) |
| ``deadline_s`` | optional | seconds after arrival (else none) |
| ``preemptible`` | optional | true/false, 1/0, yes/no (else P2 and P3 are) |
| ``tenant`` | optional | (else ``default``) |
| ``load_s`` | optional | a load time of its model, seconds (else the measured load latencies) |
| ``gpus`` | optional | the GPUs it runs across, 1..64, its ``vram_gb`` spread over them (else 1) |

An empty optional value is the same as an absent column.
"""

from __future__ import annotations

import csv
import gzip
import math
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from gpuq.errors import InvalidTask
from gpuq.sim.model import TraceTask
from gpuq.task import Priority, TaskSpec

REQUIRED = ("arrival_s", "model", "priority", "service_s")
OPTIONAL = ("vram_gb", "est_s", "deadline_s", "preemptible", "tenant", "load_s", "gpus")
# without vram_gb memory never limits placement or caching; give it to replay them
DEFAULT_VRAM_GB = 1.0
MAX_SECONDS = 1e10  # the most a duration or an arrival may be (enqueue caps est_s there too)
BOOLEANS = {"1": True, "true": True, "yes": True, "y": True,
            "0": False, "false": False, "no": False, "n": False}
GZIP_MAGIC = b"\x1f\x8b"


def open_text(file: Path) -> IO[str]:
    """The file as text: gunzipped when it is gzip data, whatever its name; a leading byte
    order mark (spreadsheets write one) is dropped."""
    with open(file, "rb") as f:
        zipped = f.read(2) == GZIP_MAGIC
    if zipped:
        return gzip.open(file, "rt", newline="", encoding="utf-8-sig")
    return open(file, newline="", encoding="utf-8-sig")


def lines(file: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each non-blank row, the header first; an unreadable file
    (not gzip or CSV text, truncated, not UTF-8) is a ValueError naming it."""
    try:
        with open_text(file) as f:
            reader = csv.reader(f)
            for fields in reader:
                if fields:
                    yield reader.line_num, fields
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"{file} is not readable CSV text (plain or gzip'd): {exc}") from None


def header(file: Path) -> list[str]:
    """The file's column names (empty for an empty file)."""
    for _, fields in lines(file):
        return [name.strip() for name in fields]
    return []


def records(file: Path, at: list[int] | None = None) -> Iterator[dict[str, str]]:
    """The rows as ``{column: value}`` (a short row lacks its last columns); ``at[0]``: the
    line of the row last given, for an error about it."""
    rows = lines(file)
    names = next(([n.strip() for n in fields] for _, fields in rows), [])
    for line, fields in rows:
        if at is not None:
            at[0] = line
        yield dict(zip(names, fields))


def read(file: Path) -> tuple[list[TraceTask], dict[str, tuple[float, ...]]]:
    """The file's requests in its order, arrivals counted from the earliest, and the load
    times its rows give by model."""
    rows = lines(file)
    names = next(([n.strip() for n in fields] for _, fields in rows), None)
    if not names:
        raise ValueError(f"{file} is empty: a trace CSV needs a header with {', '.join(REQUIRED)}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{file}: column {', '.join(repeated)} appears more than once")
    missing = [n for n in REQUIRED if n not in names]
    if missing:
        raise ValueError(f"{file}: no column {', '.join(missing)}; a trace CSV needs "
                         f"{', '.join(REQUIRED)} (optional: {', '.join(OPTIONAL)})")
    parsed: list[tuple[int, dict[str, str]]] = []
    for line, fields in rows:
        if len(fields) != len(names):
            raise ValueError(f"{file} line {line}: {len(fields)} values for {len(names)} columns")
        parsed.append((line, {n: v.strip() for n, v in zip(names, fields)}))
    return _tasks(file, parsed)


@contextmanager
def _at(file: Path, line: int) -> Iterator[None]:
    """A bad value becomes one error naming the file and the line."""
    try:
        yield
    except InvalidTask as exc:
        raise ValueError(f"{file} line {line}: {exc.reason}") from None


def _tasks(file: Path, parsed: list[tuple[int, dict[str, str]]]
           ) -> tuple[list[TraceTask], dict[str, tuple[float, ...]]]:
    arrivals, services = [], []
    for line, row in parsed:
        with _at(file, line):
            arrivals.append(_time(row["arrival_s"]))
            services.append(_duration(row["service_s"], "service_s"))
    # a producer knows its model's typical run time, not this request's
    total: defaultdict[str, float] = defaultdict(float)
    count: defaultdict[str, int] = defaultdict(int)
    for (_, row), service_s in zip(parsed, services):
        total[row["model"]] += service_s
        count[row["model"]] += 1
    typical = {model: total[model] / count[model] for model in count}
    first = min(arrivals, default=0.0)
    tasks: list[TraceTask] = []
    loads: defaultdict[str, list[float]] = defaultdict(list)
    for (line, row), arrival_s, service_s in zip(parsed, arrivals, services):
        with _at(file, line):
            task = _task(row, arrival_s - first, service_s, typical[row["model"]])
            if row.get("load_s"):
                loads[task.model].append(_duration(row["load_s"], "load_s"))
        tasks.append(task)
    return tasks, {model: tuple(values) for model, values in loads.items()}


def _task(row: dict[str, str], arrival_s: float, service_s: float, typical_s: float) -> TraceTask:
    """The request, its values checked as enqueue checks a task's."""
    given = {n: row.get(n, "") for n in OPTIONAL}
    priority = Priority.parse(row["priority"])
    preemptible = priority >= Priority.P2
    if given["preemptible"]:
        if given["preemptible"].lower() not in BOOLEANS:
            raise InvalidTask(f"preemptible must be true or false, got {given['preemptible']!r}")
        preemptible = BOOLEANS[given["preemptible"].lower()]
    spec = TaskSpec.build(
        "sim.run", None, model=row["model"], priority=priority, preemptible=preemptible,
        vram_gb=_number(given["vram_gb"], "vram_gb") if given["vram_gb"] else DEFAULT_VRAM_GB,
        est_s=_number(given["est_s"], "est_s") if given["est_s"] else typical_s,
        deadline_s=_number(given["deadline_s"], "deadline_s") if given["deadline_s"] else None,
        tenant=given["tenant"] or "default", task_id="row", gpus=_gpus(given["gpus"]))
    return TraceTask(arrival_s=arrival_s, model=spec.model, vram_gb=spec.vram_gb,
                     priority=int(spec.priority), service_s=service_s,
                     est_s=typical_s if spec.est_s is None else spec.est_s,
                     deadline_s=spec.deadline_s, preemptible=spec.preemptible, tenant=spec.tenant,
                     gpus=spec.gpus)


def _gpus(text: str) -> int:
    """A whole number of GPUs (TaskSpec.build checks its range); "2.0" is 2."""
    number = _number(text, "gpus") if text else 1.0
    if number != int(number):
        raise InvalidTask(f"gpus must be a whole number, got {text!r}")
    return int(number)


def _number(text: str, column: str) -> float:
    """A finite number (TaskSpec.build checks the range of those it takes)."""
    try:
        value = float(text)
    except ValueError:
        raise InvalidTask(f"{column} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise InvalidTask(f"{column} must be a finite number, got {text!r}")
    return value


def _duration(text: str, column: str) -> float:
    """A duration the scheduler never sees (so TaskSpec does not check it): a number >= 0."""
    value = _number(text, column)
    if not 0 <= value <= MAX_SECONDS:  # a replay's clock must hold it
        raise InvalidTask(f"{column} must be >= 0 and at most {MAX_SECONDS:g}, got {text!r}")
    return value


def _time(text: str) -> float:
    """Seconds, or an ISO 8601 time as epoch seconds (UTC when it names no zone)."""
    try:
        value = _number(text, "arrival_s")
    except InvalidTask:
        pass
    else:
        if abs(value) > MAX_SECONDS:
            raise InvalidTask(f"arrival_s must be at most {MAX_SECONDS:g} in size, got {text!r}")
        return value
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidTask(f"arrival_s {text!r} is neither seconds nor an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if abs(moment.timestamp()) > MAX_SECONDS:  # as for seconds: a replay's clock must hold it
        raise InvalidTask(f"arrival_s must be at most {MAX_SECONDS:g} s from the epoch, got {text!r}")
    return moment.timestamp()


def check(task: TraceTask) -> None:
    """A task a reader of a known trace format made, checked as a row of one's own CSV is
    (InvalidTask): those readers convert values, they do not bound them."""
    if not (math.isfinite(task.arrival_s) and abs(task.arrival_s) <= MAX_SECONDS):
        raise InvalidTask(f"arrival_s must be finite and at most {MAX_SECONDS:g} in size, "
                          f"got {task.arrival_s}")
    if not 0 <= task.service_s <= MAX_SECONDS:  # NaN fails too
        raise InvalidTask(f"service_s must be >= 0 and at most {MAX_SECONDS:g}, got {task.service_s}")
    TaskSpec.build("sim.run", None, model=task.model, priority=task.priority, vram_gb=task.vram_gb,
                   est_s=task.est_s, deadline_s=task.deadline_s, tenant=task.tenant, gpus=task.gpus,
                   task_id="row")
