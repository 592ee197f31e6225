"""What the simulator's skip-ahead relies on, without Redis: the planner's quiet time
(gpuq.reaper.preempt.quiet_until: after a plan that decided nothing, the first time a plan on
the same pool decides something)."""

from __future__ import annotations

import random

from helpers import CFG, NOW, victim

from gpuq.reaper.preempt import Idle, Victim, Waiting, plan, quiet_until


def kinds(waiting: list[Waiting], victims: list[Victim], now: int,
          idle: list[tuple[float, str]] | None = None) -> list[str]:
    return [d.kind for d in plan(waiting, victims, idle or [], set(), CFG, now)]


def test_a_young_victim_is_asked_the_moment_it_has_run_its_minimum() -> None:
    waiting, victims = [Waiting("p0", 0, 40, start_by_ms=NOW + 200)], [victim("v", "a", ran_s=2, left_s=600)]
    assert kinds(waiting, victims, NOW) == []
    first = quiet_until(waiting, victims, [], set(), CFG)
    assert first == NOW + 3000
    assert kinds(waiting, victims, first - 1) == [] and kinds(waiting, victims, first) == ["yield"]


def test_a_victim_that_may_not_be_asked_is_reserved_max_wait_before_its_end() -> None:
    waiting, victims = [Waiting("p0", 0, 40)], [victim("v", "a", left_s=600, preemptions=2)]
    first = quiet_until(waiting, victims, [], set(), CFG)
    assert first == NOW + 570_000
    assert kinds(waiting, victims, first - 1) == [] and kinds(waiting, victims, first) == ["reserve"]


def test_no_candidate_means_nothing_to_wait_for() -> None:
    waiting = [Waiting("p1", 1, 40)]
    assert quiet_until(waiting, [victim("same", "a", priority=1), victim("small", "b", usable_gb=30),
                                 victim("lane", "c", levels="23")], [], set(), CFG) is None
    young = [victim("v", "a", ran_s=1)]
    assert quiet_until(waiting, young, [Idle(43.0, "0123")], set(), CFG) is None  # an idle GPU takes it
    assert quiet_until(waiting, young, [], {"a"}, CFG) is None  # its worker is reserved already


def test_the_quiet_time_is_the_planners_first_decision_on_random_pools() -> None:
    rng = random.Random(5)
    checked = 0
    for case in range(4000):
        victims = [victim(f"v{i}", f"w{i}", priority=rng.choice((1, 2, 3)), ran_s=rng.uniform(0, 8),
                          left_s=rng.uniform(-5, 200), preemptions=rng.choice((0, 1, 2)),
                          usable_gb=rng.choice((19, 43, 75)), levels=rng.choice(("0123", "01", "23")))
                   for i in range(rng.randint(1, 4))]
        # some tasks were offered to a busy holder of their model, some pools have a GPU idle
        # some have a deadline: never waited for past their latest start
        waiting = [Waiting(f"t{i}", rng.choice((0, 1)), rng.choice((10, 30, 60)),
                           rng.choice((None, NOW - 100, NOW + 200, NOW + 50_000)),
                           rng.choice(("", "", "w0", "w1")),
                           latest_ms=rng.choice((None, None, NOW + 20_000, NOW + 90_000)))
                   for i in range(rng.randint(1, 3))]
        idle = rng.choice(([], [], [Idle(43.0, "0123")]))
        if kinds(waiting, victims, NOW, idle):
            continue
        first = quiet_until(waiting, victims, idle, set(), CFG, now_ms=NOW)
        later = [NOW + rng.randint(1, 400_000) for _ in range(5)]
        if first is None:
            assert all(kinds(waiting, victims, t, idle) == [] for t in later), case
            continue
        checked += 1
        assert first > NOW and kinds(waiting, victims, first, idle) != [], case
        assert all(kinds(waiting, victims, t, idle) == [] for t in [first - 1] + later if t < first), case
    assert checked > 200
