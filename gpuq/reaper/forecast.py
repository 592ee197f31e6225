"""Arrival forecasts: each model's expected arrival rate one model-load time ahead.

Pure functions over the arrival history enqueue keeps (``arrivals:<bucket>``: one hash per
``ARRIVAL_BUCKET_MS`` of the scripts' clock, model -> tasks enqueued), so the model is
unit-tested directly; ``gpuq.reaper.scale`` reads the buckets (``buckets_to_read``) and
``gpuq.reaper.scale_plan`` turns the forecast into desired workers.

The model, per model, with B the bucket width, W the recent window (``forecast_window_s``),
H the horizon (the model's mean catalog load time plus ``forecast_lead_s``, the time a new
worker takes to come up) and S a season (``forecast_day_s``, and 7 of them for a week):

- **level** L: the decayed recent rate, Σ count × w / Σ duration × w over the buckets of the
  last W (the current one counted for the part that has passed), w = 2^(−age / half-life),
  half-life ``forecast_half_life_s``. Ages are the buckets' midpoints' ages.
- **trend**: the rate over the later half of W less the rate over the earlier half, per
  second of W/2; the trend forecast is max(0, L + slope × H). It sees a rise that no season
  foretold, late (a rise shows in W/2 only once it has begun).
- **season**, for each of a day and a week ago, when the pool has history there (any model's
  arrivals in W before t − S: a pool that did not exist then, or was down, says nothing):
  the model's rate over the W/4 around t − S + H (what came one horizon later a season ago,
  and not sooner than t − S: a single task there reads as four a window, a rise that may
  warm an idle GPU with room but moves a class's count only past ``forecast_margin``) scaled by
  today's level against the level a season ago, (L + 1/W) / (L_S + 1/W) (one task per
  window added to both, so a model idle both times scales by 1, not 0/0), the ratio kept
  within [1/4, 4]. With both seasons, the mean of the two.
- **forecast** F = max(trend forecast, season forecast): either one seeing a rise is
  enough. Scaling up early costs idle GPU time until idle workers retire
  (``idle_timeout_s``); scaling up late costs SLA misses.

A **rise** is F > L (1 + ``RISE``) and F > 0: only then does the forecast add workers, so a
steady or falling rate leaves the reactive rule (backlog, misses) alone.

Rejected: fitting Holt-Winters (or ARIMA) per model every round — per-model parameter fits
on per-minute counts of a few tasks are noise, and each refit costs the reaper's round;
learned models (regression, neural) — they need training data, a place to run and a way to
explain a decision, and a scale signal must be explainable from its ``reason``. The simple
terms above are read from at most a few hundred small hashes a round and each is visible
in the scale hash (docs/DECISIONS.md, Scaling and warm hints).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuq.keys import ARRIVAL_BUCKET_MS

RISE = 0.1  # the forecast must exceed the level by this share to count as a rise
RATIO_BOUND = 4.0  # a season's level ratio is kept within [1/4, 4]
WEEK_DAYS = 7


@dataclass(frozen=True)
class Settings:
    """The forecast's settings (from Config: ``forecast_*``)."""

    window_s: float = 1800.0
    half_life_s: float = 300.0
    day_s: float = 86400.0
    lead_s: float = 0.0

    @property
    def window_buckets(self) -> int:
        return max(2, math.ceil(self.window_s * 1000 / ARRIVAL_BUCKET_MS))

    @property
    def seasons_ms(self) -> tuple[int, ...]:
        if self.day_s <= 0:
            return ()
        day = int(self.day_s * 1000)
        return (day, WEEK_DAYS * day)


@dataclass(frozen=True)
class Forecast:
    model: str
    level_per_s: float  # decayed recent rate
    forecast_per_s: float  # expected rate over the next horizon
    horizon_s: float
    trend_per_s: float  # the trend forecast
    season_per_s: float | None  # the seasonal forecast; None: no history a season ago

    @property
    def rising(self) -> bool:
        return self.forecast_per_s > 0 and self.forecast_per_s > self.level_per_s * (1 + RISE)

    def as_fields(self) -> dict[str, float]:
        """What the scale hash carries (rates in tasks per second)."""
        return {"rate_per_s": round(self.level_per_s, 6), "forecast_per_s": round(self.forecast_per_s, 6),
                "horizon_s": round(self.horizon_s, 3)}


def bucket_of(ms: int) -> int:
    return ms // ARRIVAL_BUCKET_MS


def buckets_to_read(now_ms: int, settings: Settings, longest_horizon_s: float) -> list[int]:
    """The buckets a round reads, ascending: the recent window, and each season's window
    and what followed it up to the longest horizon plus W/4. Bounded by the settings, not
    by the traffic (one hash per bucket, whatever the number of models)."""
    n = settings.window_buckets
    now_b = bucket_of(now_ms)
    wanted = set(range(now_b - n + 1, now_b + 1))
    for season in settings.seasons_ms:
        then = now_ms - season
        last = bucket_of(ahead_window(then, longest_horizon_s, settings)[1])
        wanted.update(range(bucket_of(then) - n + 1, last + 1))
    return sorted(wanted)


def ahead_window(then_ms: int, horizon_s: float, settings: Settings) -> tuple[int, int]:
    """The span a season's look-ahead reads: W/4 around ``then`` + H, not before ``then``."""
    mid, half = then_ms + int(horizon_s * 1000), int(settings.window_s * 1000 / 8)
    start = max(then_ms, mid - half)
    return start, max(mid + half, start + ARRIVAL_BUCKET_MS)


def _decayed(counts: Mapping[int, int], end_ms: int, settings: Settings) -> float:
    """The decayed rate (per second) over the window ending at ``end_ms``."""
    weights, den = _weights(end_ms, settings.window_buckets, settings.half_life_s)
    num = 0.0
    for k, w in weights:
        num += counts.get(k, 0) * w
    return num / den if den else 0.0


@functools.lru_cache(maxsize=64)
def _weights(end_ms: int, window_buckets: int, half_life_s: float
             ) -> tuple[tuple[tuple[int, float], ...], float]:
    """Each bucket's weight in the window ending at ``end_ms``, and the weighted seconds they
    span: the same for every model of a round, so made once (10,000 models a round)."""
    b = ARRIVAL_BUCKET_MS
    last = bucket_of(end_ms)
    weights, den = [], 0.0
    for k in range(last - window_buckets + 1, last + 1):
        start = k * b
        length = min(b, end_ms - start)
        if length <= 0:
            continue
        age_s = (end_ms - (start + length / 2)) / 1000
        w = 0.5 ** (age_s / half_life_s) if half_life_s > 0 else 1.0
        weights.append((k, w))
        den += length / 1000 * w
    return tuple(weights), den


def _rate(counts: Mapping[int, int], start_ms: int, end_ms: int) -> float:
    """Plain rate (per second) over the buckets overlapping [start_ms, end_ms)."""
    first, last = bucket_of(start_ms), bucket_of(max(start_ms, end_ms - 1))
    total = sum(counts.get(k, 0) for k in range(first, last + 1))
    return total / ((last - first + 1) * ARRIVAL_BUCKET_MS / 1000)


def _slope(counts: Mapping[int, int], now_ms: int, settings: Settings) -> float:
    """Rate change per second: the later half of the window against the earlier half
    (complete buckets only, so a young current bucket does not read as a fall)."""
    b = ARRIVAL_BUCKET_MS
    last = bucket_of(now_ms) - 1  # the last complete bucket
    half = settings.window_buckets // 2
    later = sum(counts.get(k, 0) for k in range(last - half + 1, last + 1))
    earlier = sum(counts.get(k, 0) for k in range(last - 2 * half + 1, last - half + 1))
    span_s = half * b / 1000
    return (later - earlier) / span_s / span_s


def forecast(model: str, counts: Mapping[int, int], seen: Sequence[int] | set[int], now_ms: int,
             horizon_s: float, settings: Settings) -> Forecast:
    """One model's forecast. counts: bucket -> its arrivals (buckets with none may be left
    out); seen: the buckets that held any model's arrivals (the pool's history)."""
    level = _decayed(counts, now_ms, settings)
    trend = max(0.0, level + _slope(counts, now_ms, settings) * horizon_s)
    seasons = []
    window_ms = settings.window_buckets * ARRIVAL_BUCKET_MS
    floor = 1000 / window_ms  # one task per window, per second
    for season in _with_history(tuple(seen), now_ms, window_ms, settings.seasons_ms):
        then = now_ms - season
        past_level = _decayed(counts, then, settings)
        ahead = _rate(counts, *ahead_window(then, horizon_s, settings))
        ratio = min(RATIO_BOUND, max(1 / RATIO_BOUND, (level + floor) / (past_level + floor)))
        seasons.append(ahead * ratio)
    season_rate = sum(seasons) / len(seasons) if seasons else None
    return Forecast(model, level, max(trend, season_rate or 0.0), horizon_s, trend, season_rate)


@functools.lru_cache(maxsize=16)
def _with_history(seen: tuple[int, ...], now_ms: int, window_ms: int,
                  seasons_ms: tuple[int, ...]) -> tuple[int, ...]:
    """The seasons whose window a season ago holds a bucket of ``seen`` (the pool's history):
    the same for every model of a round."""
    return tuple(season for season in seasons_ms
                 if any(bucket_of(now_ms - season - window_ms) < k <= bucket_of(now_ms - season)
                        for k in seen))


def forecasts(buckets: Mapping[int, Mapping[str, int]], now_ms: int, horizons_s: Mapping[str, float],
              settings: Settings, default_horizon_s: float = 0.0) -> dict[str, Forecast]:
    """Every model with arrivals in what was read. buckets: bucket -> {model: count};
    horizons_s: model -> its mean load time (``default_horizon_s`` when unknown); the lead
    is added to each."""
    per_model: dict[str, dict[int, int]] = {}
    for k, fields in buckets.items():
        for model, n in fields.items():
            per_model.setdefault(model, {})[k] = n
    seen = [k for k, fields in buckets.items() if fields]
    return {m: forecast(m, c, seen, now_ms, horizons_s.get(m, default_horizon_s) + settings.lead_s,
                        settings) for m, c in sorted(per_model.items())}
