"""Whether the scaler's step could hint now, and until when it cannot, the pool unchanged.

A superset of ``gpuq.reaper.scale_plan``'s hint rules, from the replay's own state: a step
hints only when one of these holds (``look`` says "maybe", and the step itself decides).

- A spare worker (in the ``idle`` set, not reserved: read from the server) exists.
- Backlog: a model with ``warm_backlog`` queued tasks (counted as the engine queues and
  claims them), not hinted within ``HINT_EVERY_MS``, that no spare worker holds, and a spare
  worker not holding it whose idle VRAM fits its smallest task.
- Forecast (``scale_signal`` "forecast"): a model with a catalog footprint, not hinted
  lately, that no spare worker holds, whose forecast expects a task per window, and a spare
  worker it fits with room (its usable VRAM less the footprints of the held models with
  arrivals in the buckets read: the scaler counts those and maybe more) or whose held models
  are cold (no level, no forecast). The forecasts are the scaler's own
  (``gpuq.reaper.forecast``) over the same buckets (kept here as enqueue writes them) and
  catalog load times (read from the server after a load).

Held models are the GPUs' loaded ones (not those still preloading), as the holders sets are.
With the pool unchanged, the answer changes only when a hint's ``HINT_EVERY_MS`` ends, a
reservation ends, or a forecast may move: its buckets move at minute boundaries (and a
season's at its own), a model's season look-ahead at offsets of its own, and between those a
forecast only falls (a level decays, the trend's slope is fixed) unless its current bucket
has arrivals or a season looks ahead at some (then it is looked at every round).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Protocol

from gpuq import catalog
from gpuq.config import Config
from gpuq.keys import ARRIVAL_BUCKET_MS, live_reservation
from gpuq.reaper import forecast
from gpuq.reaper.scale import forecast_settings
from gpuq.reaper.scale_plan import HINT_EVERY_MS
from gpuq.replies import scored
from gpuq.sim.control import Gpu
from gpuq.sim.model import TraceTask
from gpuq.sim.policies import GpuqScheduler, Scheduler
from gpuq.sim.rounds import Rounds
from gpuq.wire import exchange

B = ARRIVAL_BUCKET_MS
SLACK = 1e-9  # a forecast this close to one task per window counts as one (float sums)


class Replay(Protocol):
    """What the gate reads of the engine: its clock, its GPUs, the tasks queued per model."""

    config: Config
    scheduler: Scheduler
    now: float
    rounds: Rounds
    trace: dict[str, TraceTask]

    @property
    def workers(self) -> Sequence[Gpu]: ...

    @property
    def by_id(self) -> Mapping[str, Gpu]: ...

    def ms(self, t: float | None = None) -> int: ...


def next_change(now_ms: int, offset_ms: int) -> int:
    """The first time after now_ms at which the bucket of (time + offset_ms) changes."""
    return (((now_ms + offset_ms) // B) + 1) * B - offset_ms


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class Gate:
    def __init__(self, engine: Replay) -> None:
        self.engine = engine
        self.config = engine.config
        self.settings = forecast_settings(engine.config)
        self.arrivals: dict[int, dict[str, int]] = {}  # bucket -> model -> tasks (enqueue's)
        self.buckets_of: dict[str, list[int]] = {}  # model -> its buckets, ascending
        self.version = 0  # of the arrivals
        # the catalog, read as the scaler reads it (its mean load times are the server's sums)
        self.footprint: dict[str, float] = {}
        self.load_s: dict[str, float] = {}
        self.catalog_read = False
        self.smallest: dict[str, float] = {}  # model -> its smallest task's VRAM
        for t in engine.trace.values():
            self.smallest[t.model] = min(t.vram_gb, self.smallest.get(t.model, math.inf))
        self.usable: dict[str, float] = {}
        self.idle: dict[str, float] = {}  # the idle set: worker -> idle GB
        self.reservations: dict[str, str] = {}
        self.stale = True  # the idle set and reservations are to be read again
        self.why = ""  # what the last "maybe" was for (diagnostics)
        self.cache: dict[str, tuple[int, forecast.Forecast, int]] = {}  # model -> (at, f, until)
        self.reads: tuple[tuple[tuple[int, int], ...], int, frozenset[str], list[int]] | None = None

    @property
    def scheduler(self) -> GpuqScheduler:
        assert isinstance(self.engine.scheduler, GpuqScheduler)
        return self.engine.scheduler

    # -- what the replay writes, kept as the server keeps it -------------------------------
    def arrived(self, model: str, now_ms: int) -> None:
        k = now_ms // B
        got = self.arrivals.setdefault(k, {})
        got[model] = got.get(model, 0) + 1
        mine = self.buckets_of.setdefault(model, [])
        if not mine or mine[-1] != k:
            mine.append(k)
        self.version += 1
        self.cache.pop(model, None)
        self.stale = True

    def loaded(self, model: str) -> None:
        self.catalog_read = False
        self.cache.pop(model, None)

    def hinted(self) -> None:
        self.stale = True

    # -- the look --------------------------------------------------------------------------
    def read(self) -> None:
        s = self.scheduler
        ids = [w.id for w in self.engine.workers]
        if not self.usable:
            pipe = s.redis.pipeline(transaction=False)
            for wid in ids:
                pipe.hmget(s.keys.worker(wid), "vram_total_gb", "kv_reserve_gb")
            for wid, (total, reserve) in zip(ids, pipe.execute()):
                self.usable[wid] = float(total or 0) - float(reserve or 0)
        if not self.catalog_read:
            entries = catalog.read(s.redis, s.keys)
            self.footprint = {e.name: e.vram_gb for e in entries if e.vram_gb > 0}
            self.load_s = {e.name: e.mean_load_s for e in entries if e.loads}
            self.catalog_read = True
        got = exchange(s.redis, [("ZRANGE", s.keys.idle, 0, -1, "WITHSCORES"),
                                 *(("GET", s.keys.reservation(w)) for w in ids)], retry=True)
        self.idle = {_text(w): float(_text(gb)) for w, gb in scored(got[0])}
        self.reservations = {w: _text(v) for w, v in zip(ids, got[1:]) if v}
        self.stale = False

    def look(self) -> tuple[bool, int | None]:
        """Whether a step now could hint; when not, the first time (ms) it could with the
        pool unchanged (None: not before an event)."""
        e = self.engine
        now = e.ms()
        if self.stale:
            self.read()
        times: list[int] = []
        spare: dict[str, float] = {}
        for wid, gb in self.idle.items():
            held = live_reservation(self.reservations.get(wid), now)
            if held is None:
                spare[wid] = gb
            else:
                times.append(held[1])
        if not spare:
            return False, min(times, default=None)
        holds = {w: {m for m in e.by_id[w].cache.resident if m not in e.by_id[w].preloading}
                 for w in spare}
        by_spare = set().union(*holds.values())
        hinted_at = self.scheduler.reaper.scaler.hinted
        recent = {m for m, t in hinted_at.items() if now - t < HINT_EVERY_MS}
        times += [hinted_at[m] + HINT_EVERY_MS for m in recent]
        for m, n in e.rounds.by_model.items():
            if (n >= self.config.warm_backlog and n > 0 and m not in recent and m not in by_spare
                    and any(m not in holds[w] and gb >= self.smallest.get(m, 0.0)
                            for w, gb in spare.items())):
                self.why = "backlog"
                return True, None
        if self.config.scale_signal != "forecast":
            return False, min(times, default=None)
        return self.ahead(now, spare, holds, by_spare, recent, times)

    def ahead(self, now: int, spare: dict[str, float], holds: dict[str, set[str]],
              by_spare: set[str], recent: set[str], times: list[int]) -> tuple[bool, int | None]:
        """The forecast's hints (``gpuq.reaper.scale_ahead.ahead_hints``'s conditions)."""
        st = self.settings
        longest = max(self.load_s.values(), default=0.0) + st.lead_s
        wset, keys, seen = self.buckets(now, longest)
        window = max(self.config.forecast_window_s, 1.0)
        # the buckets read move at minute boundaries, and with each season's look-ahead
        times.append(next_change(now, 0))
        for season in st.seasons_ms:
            times.append(next_change(now, -season))
            times.append(next_change(now, -season - st.window_buckets * B))
            times.append(next_change(now, -season + forecast.ahead_window(0, longest, st)[1]))
        fits = max(self.usable.get(w, 0.0) for w in spare)
        colds: dict[str, bool] = {}

        level = (now // B - st.window_buckets + 1, now // B - (now % B == 0))  # its buckets

        def cold(w: str) -> bool:
            if w not in colds:
                colds[w] = True
                for h in holds[w] & keys:
                    ks = self.buckets_of[h]
                    i = bisect.bisect_left(ks, level[0])
                    if i < len(ks) and ks[i] <= level[1]:  # arrivals in its level's window
                        colds[w] = False
                        times.append(next_change(now, 0))
                        break
                    f, until = self.forecast(h, now, wset, seen)
                    times.append(until)
                    if max(f.forecast_per_s, f.level_per_s) > 0:
                        colds[w] = False
                        break
            return colds[w]

        for m in sorted(keys):
            gb = self.footprint.get(m, 0.0)
            if gb <= 0 or gb > fits or m in recent or m in by_spare:
                continue
            f, until = self.forecast(m, now, wset, seen)
            times.append(until)
            if f.forecast_per_s * window < 1 - SLACK:
                continue
            for w in spare:
                usable = self.usable.get(w, 0.0)
                if gb > usable:
                    continue
                room = usable - sum(self.footprint.get(h, 0.0) for h in holds[w] & keys)
                if room >= gb or cold(w):
                    self.why = "forecast"
                    return True, None
        return False, min(times)

    def buckets(self, now: int, longest: float) -> tuple[set[int], frozenset[str], list[int]]:
        """The buckets the scaler reads now, the models with arrivals in them, and those of
        them that hold any (``forecast.forecasts``'s ``seen``)."""
        wanted = forecast.buckets_to_read(now, self.settings, longest)
        ranges: list[tuple[int, int]] = []
        for k in wanted:
            if ranges and ranges[-1][1] == k - 1:
                ranges[-1] = (ranges[-1][0], k)
            else:
                ranges.append((k, k))
        key = tuple(ranges)
        if self.reads is None or self.reads[0] != key or self.reads[1] != self.version:
            models = frozenset(m for m, ks in self.buckets_of.items() if any(
                (i := bisect.bisect_left(ks, lo)) < len(ks) and ks[i] <= hi for lo, hi in ranges))
            self.reads = (key, self.version, models, [k for k in wanted if self.arrivals.get(k)])
        return set(wanted), self.reads[2], self.reads[3]

    def forecast(self, m: str, now: int, wset: set[int], seen: list[int]) -> tuple[forecast.Forecast, int]:
        """The scaler's forecast of m now, and until when it can only fall (nor reach zero)."""
        hit = self.cache.get(m)
        if hit is not None and hit[0] <= now < hit[2]:
            return hit[1], hit[2]
        st = self.settings
        counts = {k: self.arrivals[k][m] for k in self.buckets_of.get(m, ()) if k in wset}
        horizon = self.load_s.get(m, 0.0) + st.lead_s
        f = forecast.forecast(m, counts, seen, now, horizon, st)
        every = int(round(self.config.reap_interval_s * 1000))
        if counts.get(now // B) or (f.season_per_s or 0.0) > 0:
            until = now + every  # a level with arrivals this minute, a season's ratio: any time
        else:
            start, end = forecast.ahead_window(0, horizon, st)
            until = min([next_change(now, 0)]
                        + [next_change(now, -s + o) for s in st.seasons_ms for o in (start, end - 1)])
        self.cache[m] = (now, f, until)
        return f, until
