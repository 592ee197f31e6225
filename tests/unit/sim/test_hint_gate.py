"""What the replay's shortcut for the scale step relies on, without Redis: until the time the
gate names, a model's forecast (no arrival in between) does not rise, and its being asked
for at all (level or forecast above zero) does not change."""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

from gpuq.config import Config
from gpuq.keys import ARRIVAL_BUCKET_MS as B
from gpuq.reaper import forecast
from gpuq.sim.hint_gate import Gate, next_change

EPOCH = 1_800_000_000_000


def gate(config: Config) -> Gate:
    return Gate(SimpleNamespace(config=config, trace={}))  # type: ignore[arg-type]


def test_next_change_is_the_next_bucket_boundary_of_the_shifted_time() -> None:
    assert next_change(EPOCH, 0) == EPOCH + B
    assert next_change(EPOCH + B - 1, 0) == EPOCH + B
    assert next_change(EPOCH, 25_000) == EPOCH + B - 25_000
    assert next_change(EPOCH, -86_400_000) == EPOCH + B


def exact(g: Gate, model: str, now: int, longest: float) -> forecast.Forecast:
    wset, _, seen = g.buckets(now, longest)
    counts = {k: g.arrivals[k][model] for k in g.buckets_of.get(model, ()) if k in wset}
    return forecast.forecast(model, counts, seen, now, g.load_s.get(model, 0.0) + g.settings.lead_s,
                             g.settings)


@pytest.mark.parametrize("seed", range(6))
def test_a_forecast_does_not_rise_nor_reach_or_leave_zero_before_its_time(seed: int) -> None:
    rng = random.Random(seed)
    day = rng.choice([1200.0, 3600.0, 0.0])
    g = gate(replace(Config(), forecast_window_s=600.0, forecast_half_life_s=rng.choice([60.0, 300.0]),
                     forecast_day_s=day))
    models = [f"m{i}" for i in range(4)]
    g.load_s = {m: rng.uniform(5.0, 90.0) for m in models[:3]}
    longest = max(g.load_s.values())
    span_ms = int(max(day * 8, 7200.0) * 1000)
    arrivals = sorted((EPOCH + rng.randrange(span_ms), rng.choice(models)) for _ in range(300))
    checked = 0
    for _ in range(40):
        now = EPOCH + 1000 * rng.randrange(span_ms // 1000)
        g2 = gate(g.config)  # the history up to now; nothing arrives after it
        g2.load_s = g.load_s
        for t, m in arrivals:
            if t <= now:
                g2.arrived(m, t)
        for m in models:
            wset, _, seen = g2.buckets(now, longest)
            f, until = g2.forecast(m, now, wset, seen)
            assert until > now
            asked = max(f.forecast_per_s, f.level_per_s) > 0
            for t in range(now + 1000, min(until, now + 900_000), 1000):
                later = exact(g2, m, t, longest)
                assert later.forecast_per_s <= f.forecast_per_s * (1 + 1e-12), (seed, m, now, t)
                assert (max(later.forecast_per_s, later.level_per_s) > 0) == asked, (seed, m, now, t)
                checked += 1
    assert checked > 300
