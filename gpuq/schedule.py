"""Periodic tasks: a named task template enqueued every interval or on a cron expression.

A schedule lives in the pool: ``schedules`` maps its name to JSON (``every_ms`` or
``cron``, ``skip_missed``, ``anchor_ms``: when it was added, and ``task``: the template,
TaskSpec.build's fields, payload as JSON text), ``schedules:fired`` its last period fired.
The active reaper calls ``fire_due`` each round: for each schedule, the latest period due
by the server's clock (``every``: the anchor plus a whole number of intervals; cron: the
latest matching minute), if later than the last one fired, is fired by fire.lua, which
compares, enqueues and records in one call: one run per period, whatever the number of
reapers or their restarts. Periods missed while no reaper ran give one run on its return
(the latest period), or none with ``skip_missed`` (a period more than ``GRACE_MS`` old).
"""

from __future__ import annotations

import json
import logging
import re
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import redis

from gpuq.clock import server_ms
from gpuq.connection import redis_errors
from gpuq.cron import Cron
from gpuq.errors import BadSchedule, GpuqError, ScheduleError
from gpuq.keys import REQUIRED, Keys
from gpuq.replies import Code, checked
from gpuq.scripts import Call, Calls, Scripts
from gpuq.task import TaskSpec
from gpuq.tenants import Tenant

log = logging.getLogger(__name__)
GRACE_MS = 60_000  # skip_missed: a period fired later than this after its time is skipped
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
_EVERY = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?")
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_every(text: str | float) -> int:
    """An interval such as "10m", "90s", "1.5h", "2d" or "30" (seconds, a number too), in ms;
    >= 1 s."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        text = repr(float(text))  # inf and nan stay unparsed: refused below
    m = _EVERY.fullmatch(text.strip()) if isinstance(text, str) else None
    if not m:
        raise BadSchedule(f"every {text!r}: expected a number and a unit (ms, s, m, h, d)")
    every_f = float(m.group(1)) * _UNITS_MS[m.group(2) or "s"]  # inf for a huge number
    if every_f > 366 * 86_400_000:
        raise BadSchedule(f"every {text!r}: the interval must be at most 366 days")
    every = int(every_f)
    if every < 1000:
        raise BadSchedule(f"every {text!r}: the interval must be at least 1 s")
    return every


@dataclass(frozen=True)
class Schedule:
    name: str
    every_ms: int | None
    cron: str | None
    skip_missed: bool
    anchor_ms: int  # when it was added: every's periods are anchor + k * every_ms, k >= 1
    task: dict[str, Any]
    last_ms: int | None = None  # the last period fired (None: none yet)

    @classmethod
    def from_json(cls, name: str, text: str, last: str | None) -> Schedule:
        d = json.loads(text)
        return cls(name, d.get("every_ms"), d.get("cron"), bool(d.get("skip_missed")),
                   int(d["anchor_ms"]), d["task"], int(last) if last else None)

    def due_period(self, now_ms: int) -> int | None:
        """The latest period at or before now_ms (not before it was added), or None."""
        if self.every_ms:
            k = (now_ms - self.anchor_ms) // self.every_ms
            return self.anchor_ms + k * self.every_ms if k >= 1 else None
        period = Cron.parse(self.cron or "").latest(now_ms)
        return period if period is not None and period > self.anchor_ms else None

    def next_ms(self, after_ms: int) -> int | None:
        """The first period after after_ms."""
        if self.every_ms:
            k = max(0, (after_ms - self.anchor_ms) // self.every_ms) + 1
            return self.anchor_ms + k * self.every_ms
        return Cron.parse(self.cron or "").next_after(max(after_ms, self.anchor_ms))

    def to_dict(self, now_ms: int | None = None) -> dict[str, Any]:
        out = {"name": self.name, "every_s": self.every_ms / 1000 if self.every_ms else None,
               "cron": self.cron, "skip_missed": self.skip_missed,
               "last_period": self.last_ms / 1000 if self.last_ms else None, "task": self.task}
        if now_ms is not None:
            nxt = self.next_ms(max(now_ms, self.last_ms or 0))
            out["next_period"] = nxt / 1000 if nxt else None
        return out


def add(client: redis.Redis, keys: Keys, name: str, handler: str, payload: Any = None, *,
        every: str | float | None = None, cron: str | None = None, skip_missed: bool = False, url: str = "",
        **options: Any) -> Schedule:
    """Store a schedule (ScheduleError, nothing stored, when the name is taken or bad, both
    or neither of every and cron are given, or either is malformed, or its tenant is not
    registered in a pool that requires it or its caps could never let the task run;
    InvalidTask for a bad task template).
    ``options``: TaskSpec.build's, but no delay, at or after. ``url``: the server's, for
    errors (a Queue's ``url``; empty: read from the client)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise BadSchedule(f"name {name!r}: 1..100 letters, digits or _ . : -")
    if (every is None) == (cron is None):
        raise BadSchedule("give one of every and cron")
    every_ms = parse_every(every) if every is not None else None
    expr = Cron.parse(cron).text if cron is not None else None
    if set(options) & {"delay_s", "at", "after", "after_any_outcome", "task_id"}:
        raise BadSchedule("a schedule's runs take no delay, at, after or task_id")
    spec = TaskSpec.build(handler, payload, **options)
    with _errors(client, url):
        required, known = client.hmget(keys.tenants, REQUIRED, spec.tenant)
    if required == "1" and known is None:
        # its runs' enqueue would refuse them (InvalidTask): bad input, as there
        raise BadSchedule(f"tenant {spec.tenant} is not registered (this pool requires it: "
                            "gpuq tenant set)")
    terms = Tenant.parse(spec.tenant, known) if isinstance(known, str) else None
    if terms is not None and (why := terms.past_caps(spec.gpus, spec.vram_gb)):
        raise BadSchedule(why)  # its runs would end failed (fire.lua)
    task = {"handler": spec.handler, "payload": spec.payload, "model": spec.model,
            "vram_gb": spec.vram_gb, "priority": int(spec.priority), "preemptible": spec.preemptible,
            "tenant": spec.tenant, "max_attempts": spec.max_attempts}
    if spec.gpus > 1:
        task["gpus"] = spec.gpus
    if spec.est_s is not None:
        task["est_s"] = spec.est_s
    if spec.deadline_s is not None:
        task["deadline_ms"] = max(1, int(spec.deadline_s * 1000))
    with _errors(client, url):
        s = Schedule(name, every_ms, expr, skip_missed, server_ms(client), task)
        value = {"every_ms": every_ms, "cron": expr, "skip_missed": skip_missed,
                 "anchor_ms": s.anchor_ms, "task": task}
        text = json.dumps({k: v for k, v in value.items() if v is not None})
        stored = client.hsetnx(keys.schedules, name, text)
    if not stored:
        raise ScheduleError(f"{name} exists (remove it first)")
    return s


def list_schedules(client: redis.Redis, keys: Keys, *, url: str = "") -> list[Schedule]:
    """Every schedule of the pool, by name (one with an unreadable value is left out)."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.schedules)
    pipe.hgetall(keys.schedule_fired)
    with _errors(client, url):
        stored, fired = pipe.execute()
    out = []
    for name, text in sorted(stored.items()):
        try:
            out.append(Schedule.from_json(str(name), str(text), fired.get(name)))
        except (ValueError, KeyError, TypeError, AttributeError, GpuqError):  # "-1": not a mapping
            continue
    return out


def remove(client: redis.Redis, keys: Keys, name: str, *, url: str = "") -> None:
    """Remove a schedule (its runs already enqueued stay); ScheduleError if there is none."""
    pipe = client.pipeline(transaction=True)
    pipe.hdel(keys.schedules, name)
    pipe.hdel(keys.schedule_fired, name)
    with _errors(client, url):
        removed = pipe.execute()[0]
    if not removed:
        raise ScheduleError(f"no schedule named {name!r}")


def _errors(client: redis.Redis, url: str) -> AbstractContextManager[None]:
    """A dead or refusing Redis as a GpuqError (ConnectionFailed...), as a Queue's calls raise
    it, naming ``url`` (a Queue's ``url``), else the server the client was made for. The
    client must be a synchronous one (an AsyncQueue's is not: a sync Queue serves its
    schedules)."""
    if isinstance(client, (redis.asyncio.Redis, redis.asyncio.RedisCluster)):
        raise ScheduleError("schedules take a synchronous client (Queue.redis), not an asyncio one")
    if url:
        return redis_errors(url)
    pool = getattr(client, "connection_pool", None)
    kw = getattr(pool, "connection_kwargs", {})
    scheme = "rediss" if isinstance(pool, redis.ConnectionPool) and issubclass(
        pool.connection_class, redis.SSLConnection) else "redis"
    user = f"{kw.get('username') or ''}:***@" if kw.get("password") else ""  # never the password
    return redis_errors(f"{scheme}://{user}{kw.get('host', '')}:{kw.get('port', '')}/{kw.get('db', 0)}")


def fire_call(calls: Calls, name: str, period_ms: int, *, skip: bool = False,
              now_ms: int = 0) -> Call[str]:
    """fire.lua for one schedule and period; the reply: the run's id, "skipped", "done" or
    "failed" (the run ended failed at once: fire.lua says why in its error)."""
    cfg = calls.config
    args = [str(now_ms), name, str(period_ms), "1" if skip else "0",
            *(str(x) for x in cfg.sla_ms()), str(int(cfg.result_ttl_s * 1000))]

    def parse(r: list[Any]) -> str:
        if int(r[0]) == Code.NOT_FOUND:
            return "done"  # removed meanwhile
        checked(r)
        return str(r[2]) if str(r[1]) == "enqueued" else str(r[1])

    return Call("fire", args, parse)


def fire_due(client: redis.Redis, keys: Keys, scripts: Scripts, calls: Calls,
             now_ms: int = 0) -> int:
    """Fire each schedule's latest due period not fired yet (the reaper's round); returns
    the runs enqueued (a run that ended failed at once is logged, not counted). now_ms: a
    virtual clock (0: the server's)."""
    schedules = list_schedules(client, keys)
    if not schedules:
        return 0
    now = now_ms or server_ms(client)
    runs = 0
    for s in schedules:
        try:
            period = s.due_period(now)
            if period is None or (s.last_ms is not None and period <= s.last_ms):
                continue
            skip = s.skip_missed and now - period > GRACE_MS
            out = scripts.run(fire_call(calls, s.name, period, skip=skip, now_ms=now_ms))
        except GpuqError as exc:  # a stored schedule damaged: the others still fire
            log.error("schedule.unfireable schedule=%s error=%s", s.name, exc)
            continue
        if out == "failed":
            log.warning("schedule.run_failed schedule=%s period=%d: see the run's error", s.name, period)
        runs += out not in ("skipped", "done", "failed")
    return runs
