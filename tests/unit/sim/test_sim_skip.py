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


def test_the_quiet_time_holds_where_only_a_set_of_later_victims_may_be_asked() -> None:
    """Found by a review: the plan judged "a victim may be asked, plus the grace, before the
    soonest end" over the options it sees now, where a worker's set of the victims that may
    be asked later does not exist yet; quiet_until over those it will see. The plan reserved
    at 70 s where quiet_until said 80 s (the set's coming of age), so a replay skipping
    ahead and the reaper decided differently."""
    from gpuq import Config

    cfg = Config(max_wait_s=30, preempt_min_runtime_s=80, preempt_max=2)
    worn = Victim("a", 1, "w", 3, NOW - 10_000, 100, 2, 4, "0123", freed_gb=6)  # ends at +90 s
    b = Victim("b", 1, "w", 3, NOW, 100, 0, 4, "0123", freed_gb=6)  # +100 s, asked at +80 s
    c = Victim("c", 1, "w", 3, NOW, 400, 0, 4, "0123", freed_gb=6)
    waiting = [Waiting("p0", 0, 10, start_by_ms=NOW - 100)]
    assert plan(waiting, [worn, b, c], [], set(), cfg, NOW) == []
    first = quiet_until(waiting, [worn, b, c], [], set(), cfg, now_ms=NOW)
    assert first == NOW + 80_000
    assert plan(waiting, [worn, b, c], [], set(), cfg, NOW + 70_000) == []
    (d,) = plan(waiting, [worn, b, c], [], set(), cfg, first)
    assert (d.kind, [v.id for v in d.victims]) == ("yield", ["b", "c"])


def test_a_task_past_its_latest_start_is_planned_no_room() -> None:
    """Found by a review: a task that can no longer end by its deadline (it expires) still
    had a victim asked to yield for it between the reaper's expiry passes."""
    waiting = [Waiting("p0", 0, 40, start_by_ms=NOW - 5_000, latest_ms=NOW - 1)]
    victims = [victim("v", "a", left_s=300)]
    assert plan(waiting, victims, [], set(), CFG, NOW) == []
    assert quiet_until(waiting, victims, [], set(), CFG, now_ms=NOW) is None


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


def test_no_decision_comes_before_the_quiet_time_where_victims_share_workers() -> None:
    """As above, with victims sharing workers whose ends make room only together (sets of
    the victims that may be asked now, or later: candidates_for's ``together``). There the
    set that may be asked grows as each victim comes of age, so the quiet time may be one
    at which the plan still decides nothing (a pass for nothing), but never later than the
    plan's first decision (which would skip it)."""
    from dataclasses import replace

    from gpuq import Config

    cfg = Config(max_wait_s=30, preempt_min_runtime_s=20, preempt_max=2)
    rng = random.Random(7)
    checked = 0
    for case in range(3000):
        victims = [replace(victim(f"v{i}", rng.choice(("w0", "w1")), priority=rng.choice((2, 3)),
                                  ran_s=rng.uniform(0, 30), left_s=rng.uniform(-5, 120),
                                  preemptions=rng.choice((0, 0, 2)), usable_gb=rng.choice((4, 8, 40))),
                           freed_gb=rng.choice((4, 6)))
                   for i in range(rng.randint(2, 5))]
        waiting = [Waiting("t0", 0, rng.choice((10, 14)), rng.choice((None, NOW - 100, NOW + 50_000)),
                           latest_ms=rng.choice((None, None, NOW + 60_000)))]
        if plan(waiting, victims, [], set(), cfg, NOW):
            continue
        first = quiet_until(waiting, victims, [], set(), cfg, now_ms=NOW)
        later = [NOW + rng.randint(1, 200_000) for _ in range(5)]
        if first is None:
            assert all(plan(waiting, victims, [], set(), cfg, t) == [] for t in later), case
            continue
        checked += 1
        assert first > NOW, case
        before = [t for t in [first - 1] + later if t < first]
        assert all(plan(waiting, victims, [], set(), cfg, t) == [] for t in before), case
    assert checked > 100

