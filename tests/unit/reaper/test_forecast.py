"""gpuq.reaper.forecast: the arrival forecast over hand-built bucket counts (no Redis)."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from gpuq.keys import ARRIVAL_BUCKET_MS, ARRIVAL_TTL_S
from gpuq.reaper.forecast import Settings, bucket_of, buckets_to_read, forecast, forecasts

B = ARRIVAL_BUCKET_MS
DAY_MS = 86_400_000
NOW = 1_800_000_000_000 - 1_800_000_000_000 % B + B // 2  # half-way through a bucket
SET = Settings(window_s=1800, half_life_s=300, day_s=86400)
N = SET.window_buckets  # 30


def steady(rate_per_min: int, end_ms: int = NOW, buckets: int = N + 1) -> dict[int, int]:
    """rate_per_min arrivals in each of the ``buckets`` buckets up to end_ms's (its own
    counted for the half that has passed)."""
    last = bucket_of(end_ms)
    out = {k: rate_per_min for k in range(last - buckets + 1, last)}
    out[last] = rate_per_min // 2
    return out


def test_the_lua_bucket_and_ttl_are_the_python_constants() -> None:
    lua = resources.files("gpuq").joinpath("lua", "lib", "arrivals.lua").read_text()
    bucket = re.search(r"arrivals_key\(ms\(\(now - now % (\d+)\) / (\d+)\)\)", lua)
    assert bucket is not None and bucket.group(1) == bucket.group(2) == str(B)
    assert re.search(r"'EXPIRE', bucket, '(\d+)'\)", lua).group(1) == str(ARRIVAL_TTL_S)  # type: ignore[union-attr]
    # a week of history and the windows around it fit in the TTL
    assert ARRIVAL_TTL_S * 1000 > 7 * DAY_MS + 2 * SET.window_s * 1000


def test_a_steady_rate_is_its_level_and_no_rise() -> None:
    f = forecast("m", steady(6), [], NOW, 30.0, SET)
    assert f.level_per_s == pytest.approx(0.1)
    assert f.trend_per_s == pytest.approx(0.1)
    assert f.season_per_s is None  # no history a day ago
    assert f.forecast_per_s == pytest.approx(0.1) and not f.rising


def test_the_level_weighs_recent_buckets_more() -> None:
    counts = {k: 0 for k in range(bucket_of(NOW) - N + 1, bucket_of(NOW) + 1)}
    early, late = dict(counts), dict(counts)
    early[bucket_of(NOW) - 20] = 10
    late[bucket_of(NOW) - 2] = 10
    recent = forecast("m", late, [], NOW, 0, SET).level_per_s
    assert recent > 3 * forecast("m", early, [], NOW, 0, SET).level_per_s


def test_a_rising_trend_forecasts_more_than_the_level() -> None:
    last = bucket_of(NOW)
    counts = {k: (0 if k < last - N // 2 else 6) for k in range(last - N + 1, last + 1)}
    f = forecast("m", counts, [], NOW, 120.0, SET)
    assert f.trend_per_s > f.level_per_s and f.rising
    falling = {k: (6 if k < last - N // 2 else 0) for k in range(last - N + 1, last + 1)}
    assert forecast("m", falling, [], NOW, 120.0, SET).forecast_per_s == 0.0  # clamped at 0


def test_yesterday_foretells_a_rise_before_it_comes() -> None:
    """Quiet now and yesterday at this time; yesterday the model got 12 a minute from one
    horizon later on: today the forecast rises, scaled by today's level against yesterday's."""
    then = NOW - DAY_MS
    counts: dict[int, int] = {k: 12 for k in range(bucket_of(then + 60_000), bucket_of(then) + 15)}
    seen = {bucket_of(then) - 5}  # the pool had arrivals (another model's) a day ago
    f = forecast("m", counts, seen, NOW, 60.0, SET)
    assert f.level_per_s == 0.0 and f.trend_per_s == 0.0
    assert f.season_per_s is not None and f.season_per_s > 0.1 and f.rising
    # with no history a day ago (a new pool), the same counts say nothing
    assert forecast("m", counts, set(), NOW, 60.0, SET).season_per_s is None
    # today busier than yesterday at the same time: the season is scaled up
    busy = {**counts, **steady(6)}
    yday_quiet = forecast("m", busy, seen, NOW, 60.0, SET).season_per_s
    assert yday_quiet is not None and yday_quiet > f.season_per_s


def test_a_week_ago_is_averaged_with_a_day_ago() -> None:
    week = NOW - 7 * DAY_MS
    counts = {k: 6 for k in range(bucket_of(week) - 2, bucket_of(week) + 15)}
    seen = {bucket_of(NOW - DAY_MS) - 1, bucket_of(week) - 1}
    f = forecast("m", counts, seen, NOW, 60.0, SET)
    # a week ago 0.1/s (level 0.1: ratio 1/(0.1·W+1) ~ 1/4 at today's 0), a day ago nothing
    assert f.season_per_s == pytest.approx((0.1 * 0.25 + 0.0) / 2)


def test_buckets_to_read_are_bounded_and_cover_every_window() -> None:
    read = buckets_to_read(NOW, SET, 90.0)
    now_b = bucket_of(NOW)
    assert set(range(now_b - N + 1, now_b + 1)) <= set(read)
    for season in (DAY_MS, 7 * DAY_MS):
        then = bucket_of(NOW - season)
        assert set(range(then - N + 1, then + 1)) <= set(read)
        # the look-ahead: W/4 (450 s) around one horizon (90 s) on
        assert bucket_of(NOW - season + 90_000 + 225_000) in read
    assert len(read) < 3 * N + 30
    assert buckets_to_read(NOW, Settings(day_s=0), 90.0) == list(range(now_b - N + 1, now_b + 1))


def test_forecasts_covers_each_model_with_its_horizon() -> None:
    k = bucket_of(NOW)
    got = forecasts({k: {"a": 3}, k - 1: {"a": 6, "b": 1}, k - 2: {}}, NOW, {"a": 40.0},
                    Settings(lead_s=60.0), default_horizon_s=0.0)
    assert sorted(got) == ["a", "b"]
    assert got["a"].horizon_s == 100.0 and got["b"].horizon_s == 60.0
    assert got["a"].as_fields()["horizon_s"] == 100.0
