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


def test_a_pass_is_brought_forward_to_when_the_planner_said_it_could_decide() -> None:
    r = reaper()
    r.active = True
    now, next_round = time.monotonic(), time.monotonic() + 1.0
    wall_ms = time.time() * 1000
    r.preemptor.quiet_until = None  # nothing said: the next round
    assert r.planned_pass(next_round) == next_round
    r.preemptor.quiet_until = int(wall_ms + 300)  # a victim comes of age in 0.3 s
    assert 0.2 < r.planned_pass(next_round) - now < 0.4
    r.preemptor.quiet_until = int(wall_ms + 5000)  # after the next round: the round covers it
    assert r.planned_pass(next_round) == next_round
    r.preemptor.quiet_until = int(wall_ms - 10)  # a pass that decided (its own time): no repeat
    assert r.planned_pass(next_round) == next_round
    r.active, r.preemptor.quiet_until = False, int(wall_ms + 300)  # a standby plans nothing
    assert r.planned_pass(next_round) == next_round


def test_a_reaper_that_lost_its_lock_while_it_waited_acts_not_and_gives_the_token_back() -> None:
    """Found by an operator (SIGSTOP of the active reaper, a standby taking over): the
    resumed one ran the preemption pass its popped token asked for, beside the new leader,
    on the lock it held before the freeze; the token was lost to the new leader."""
    r = reaper()
    assert r.lead()
    assert r.still_leads("1") and r.redis.llen(r.keys.urgent) == 0
    r.redis.delete(r.keys.reaper_lock)  # the lock lapsed while it was frozen ...
    other = Reaper(r.redis, Config(pool="p"))
    assert other.lead()  # ... and a standby took it
    assert not r.still_leads("1") and not r.active
    assert r.redis.lrange(r.keys.urgent, 0, -1) == ["1"]  # for the new leader
