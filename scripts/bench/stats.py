"""Measuring tools: percentiles, INFO commandstats and CPU windows, drain rates from records."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis


def pct(values: list[float] | list[int], p: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = max(0, min(len(s) - 1, int(round(p / 100 * (len(s) - 1)))))
    return float(s[k])


def _script_folded(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """INFO commandstats by command, FCALL and EVALSHA as one "script" (gpuq sends FCALL,
    EVALSHA where the server cannot load its library; the other queues' scripts EVALSHA)."""
    out = {k.removeprefix("cmdstat_"): v for k, v in stats.items()}
    calls = [out.pop(k) for k in ("fcall", "evalsha") if k in out]
    if calls:
        out["script"] = {f: sum(int(c[f]) for c in calls) for f in ("calls", "usec")}
    return out


def cmdstats(r: redis.Redis) -> dict[str, int]:
    return {k: int(v["calls"]) for k, v in _script_folded(r.info("commandstats")).items()}


def server_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@dataclass
class Window:
    """What the server did during one measured phase (INFO deltas, our own calls removed)."""

    commands: dict[str, int]
    server_cpu_s: float

    @property
    def total(self) -> int:
        return sum(self.commands.values())

    def calls(self, name: str) -> int:
        return self.commands.get(name, 0)


@contextmanager
def window(r: redis.Redis, out: list[Window]) -> Iterator[None]:
    """Record INFO commandstats and server CPU around a block (the INFO calls excluded)."""
    before, cpu0 = cmdstats(r), server_cpu(r)
    yield
    cpu1, after = server_cpu(r), cmdstats(r)
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    delta["info"] = delta.get("info", 0) - 2  # the two INFO cpu reads fall inside the window
    delta = {k: v for k, v in delta.items() if v}
    out.append(Window(delta, cpu1 - cpu0))


@contextmanager
def maybe_window(r: redis.Redis, out: list[Window] | None) -> Iterator[None]:
    """``window`` when ``out`` is given, else nothing (only the first round keeps windows)."""
    if out is None:
        yield
    else:
        with window(r, out):
            yield


def usec_stats(r: redis.Redis) -> dict[str, tuple[int, int]]:
    """INFO commandstats as {command: (calls, total µs)}."""
    return {k: (int(v["calls"]), int(v["usec"])) for k, v in _script_folded(r.info("commandstats")).items()}


@contextmanager
def usec_window(r: redis.Redis, out: dict[str, tuple[int, int]]) -> Iterator[None]:
    before = usec_stats(r)
    yield
    after = usec_stats(r)
    for k, (calls, usec) in after.items():
        c0, u0 = before.get(k, (0, 0))
        if k != "info" and calls - c0:
            out[k] = (calls - c0, usec - u0)


def script_profile(stats: dict[str, tuple[int, int]], n: int, wall_s: float) -> dict[str, float]:
    """One script's server time per call, split into its inner commands and the rest
    (Lua itself and the glue of each redis.call), from an isolated commandstats window."""
    calls, usec = stats.get("script", (0, 0))
    inner_calls = sum(c for k, (c, _) in stats.items() if k != "script")
    inner_usec = sum(u for k, (_, u) in stats.items() if k != "script")
    return {"calls": calls, "server_us": round(usec / max(1, calls), 1),
            "inner_commands": round(inner_calls / max(1, calls), 2),
            "inner_us": round(inner_usec / max(1, calls), 1),
            "lua_and_glue_us": round((usec - inner_usec) / max(1, calls), 1),
            "round_trip_us": round(wall_s / n * 1e6, 1)}


def timed_rate(n: int, fn: Callable[[], None]) -> tuple[float, float]:
    """(ops/s, client CPU µs per op) of fn, which performs n operations."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return n / wall, cpu / n * 1e6


@dataclass
class Drain:
    """One worker draining a pre-filled queue, timed from the tasks' own records."""

    n: int
    rate: float  # tasks/s from the first claim (after warm-up) to the last ack
    rate_all: float  # tasks/s from the very first claim to the last ack
    process_rate: float  # tasks/s over the worker process's whole life (start-up included)
    process_wall_s: float
    span_s: float
    worker_cpu_us: float  # CPU of the worker process per task
    server_cpu_us: float  # CPU of redis-server per task during the drain
    window: Window

    def as_dict(self) -> dict[str, Any]:
        return {"tasks": self.n, "per_s": round(self.rate, 1), "per_s_incl_first": round(self.rate_all, 1),
                "per_s_process_wall": round(self.process_rate, 1),
                "process_wall_s": round(self.process_wall_s, 3), "span_s": round(self.span_s, 3),
                "worker_cpu_us_per_task": round(self.worker_cpu_us, 1),
                "server_cpu_us_per_task": round(self.server_cpu_us, 1),
                "commands_per_task_incl_lua": round(self.window.total / self.n, 2),
                "script_calls_per_task": round(self.window.calls("script") / self.n, 3)}


def warm_count(n: int) -> int:
    return min(500, n // 10)


def drain_rate(starts: list[float], ends: list[float], warm: int) -> tuple[float, float, float]:
    """(rate after warm-up, rate of all, span) from per-task start and end times (seconds)."""
    order = sorted(starts)
    last = max(ends)
    span = last - order[0]
    rate_all = len(order) / span if span > 0 else float("inf")
    t0 = order[warm]
    rate = (len(order) - warm) / (last - t0) if last > t0 else float("inf")
    return rate, rate_all, span


def make_drain(n: int, starts: list[float], ends: list[float], wall: float, cpu_s: float,
               own: Window) -> Drain:
    """A Drain from the tasks' start/end times, the process's wall and CPU, the server window."""
    rate, rate_all, span = drain_rate(starts, ends, warm_count(n))
    return Drain(n, rate, rate_all, n / wall, wall, span, cpu_s / n * 1e6,
                 own.server_cpu_s / n * 1e6, own)


def read_times(r: redis.Redis, keys: list[str], start_field: str, end_field: str,
               conv: Callable[[Any], float]) -> tuple[list[float], list[float]]:
    starts, ends = [], []
    for i in range(0, len(keys), 2000):
        pipe = r.pipeline(transaction=False)
        for k in keys[i:i + 2000]:
            pipe.hmget(k, start_field, end_field)
        for k, (s, e) in zip(keys[i:i + 2000], pipe.execute()):
            if not s or not e:
                raise RuntimeError(f"{k} did not run to the end (start={s!r}, end={e!r})")
            starts.append(conv(s))
            ends.append(conv(e))
    return starts, ends


def ms_to_s(v: Any) -> float:
    return int(v) / 1000.0
