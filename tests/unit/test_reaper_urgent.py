"""The reaper's wait between rounds: it takes the urgent token only while active, and runs
urgent passes at least URGENT_GAP_S apart."""

from __future__ import annotations

import time

import fakeredis

from gpuq import Config
from gpuq.reaper.loop import URGENT_GAP_S, Reaper


def reaper() -> Reaper:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
    return Reaper(client, Config(pool="p"))


def test_the_active_reaper_takes_the_token_at_once() -> None:
    r = reaper()
    r.active = True
    r.redis.lpush(r.keys.urgent, "1")
    started = time.monotonic()
    assert r.wait_urgent(0.0, started + 5.0)
    assert time.monotonic() - started < 1.0
    assert r.redis.llen(r.keys.urgent) == 0


def test_a_standby_leaves_the_token_for_the_active_one() -> None:
    r = reaper()
    r.active = False
    r.redis.lpush(r.keys.urgent, "1")
    assert not r.wait_urgent(0.0, time.monotonic() + 0.05)
    assert r.redis.llen(r.keys.urgent) == 1


def test_passes_come_at_least_the_gap_apart() -> None:
    r = reaper()
    r.active = True
    r.redis.lpush(r.keys.urgent, "1")
    started = time.monotonic()
    assert r.wait_urgent(started + URGENT_GAP_S, started + 5.0)
    assert time.monotonic() - started >= URGENT_GAP_S


def test_no_token_means_waiting_until_the_next_round() -> None:
    r = reaper()
    r.active = True
    started = time.monotonic()
    assert not r.wait_urgent(0.0, started + 0.2)
    assert time.monotonic() - started >= 0.15
