"""The preemption planner's rules (gpuq.reaper.preempt.plan), without Redis."""

from __future__ import annotations

from dataclasses import replace

from helpers import CFG, NOW, victim

from gpuq.reaper.preempt import Idle, Victim, Waiting, plan, quiet_until
from gpuq.reaper.preempt_limits import Limits
from gpuq.reaper.preempt_options import idle_to_read, split_idle


def test_victim_ending_within_max_wait_is_reserved_not_interrupted() -> None:
    w = Waiting("p0", 0, 40)
    out = plan([w], [victim("long", "a", left_s=300), victim("soon", "b", left_s=10)], [], set(), CFG, NOW)
    assert [(d.kind, d.victim.id) for d in out] == [("reserve", "soon")]
    assert out[0].ends_in_s == 10


def test_only_long_victims_the_soonest_ending_is_asked_to_yield() -> None:
    out = plan([Waiting("p0", 0, 40)], [victim("a", "a", left_s=300), victim("b", "b", left_s=100)],
               [], set(), CFG, NOW)
    assert [(d.kind, d.victim.id) for d in out] == [("yield", "b")]


def test_protections_minimum_runtime_and_maximum_preemptions() -> None:
    young = victim("young", "a", ran_s=1, left_s=100)
    worn = victim("worn", "b", left_s=100, preemptions=2)
    ok = victim("ok", "c", left_s=500)
    out = plan([Waiting("p0", 0, 40)], [young, worn, ok], [], set(), CFG, NOW)
    assert [(d.kind, d.victim.id) for d in out] == [("yield", "ok")]
    assert plan([Waiting("p0", 0, 40)], [young, worn], [], set(), CFG, NOW) == []


def test_a_soon_ending_young_victim_is_still_waited_for() -> None:
    # waiting for a natural end interrupts nothing, so the protections do not apply
    out = plan([Waiting("p0", 0, 40)], [victim("young", "a", ran_s=1, left_s=5, preemptions=2)],
               [], set(), CFG, NOW)
    assert [(d.kind, d.victim.id) for d in out] == [("reserve", "young")]


def test_victims_must_be_lower_priority_on_a_large_enough_gpu_in_the_right_lane() -> None:
    victims = [victim("same", "a", priority=1), victim("small", "b", usable_gb=19),
               victim("lane", "c", levels="23"), victim("fits", "d", left_s=900)]
    out = plan([Waiting("p1", 1, 40)], victims, [], set(), CFG, NOW)
    assert [d.victim.id for d in out] == ["fits"]


def test_an_idle_worker_that_fits_means_no_preemption() -> None:
    victims = [victim("v", "a", left_s=5)]
    assert plan([Waiting("p0", 0, 40)], victims, [Idle(43.0, "0123")], set(), CFG, NOW) == []
    # an idle worker too small, or not serving P0, does not count
    out = plan([Waiting("p0", 0, 40)], victims, [Idle(20.0, "0123"), Idle(80.0, "23")], set(), CFG, NOW)
    assert len(out) == 1


def test_each_worker_serves_one_waiting_task_and_reserved_workers_are_skipped() -> None:
    victims = [victim("v1", "a", left_s=5), victim("v2", "b", left_s=6), victim("v3", "c", left_s=7)]
    waiting = [Waiting("x", 1, 10), Waiting("y", 0, 10), Waiting("z", 0, 10)]
    out = plan(waiting, victims, [], {"a"}, CFG, NOW)
    # P0 first; worker a already holds a reservation
    assert [(d.waiting.id, d.victim.worker) for d in out] == [("y", "b"), ("z", "c")]


# --- the waiting task's start-by time (its queue score: enqueue + SLA) ----------------------

def test_a_natural_end_after_the_start_by_time_is_not_waited_for_while_the_sla_can_be_met() -> None:
    # ends in 10 s (within max_wait) but the task must start within 200 ms: only a yield helps
    w = Waiting("p0", 0, 40, start_by_ms=NOW + 200)
    out = plan([w], [victim("soon", "a", left_s=10), victim("long", "b", left_s=300)], [], set(), CFG, NOW)
    assert [(d.kind, d.victim.id) for d in out] == [("yield", "soon")]


def test_a_natural_end_before_the_start_by_time_is_waited_for() -> None:
    w = Waiting("p1", 1, 40, start_by_ms=NOW + 1000)
    out = plan([w], [victim("now", "a", left_s=0.5), victim("long", "b", left_s=300)], [], set(), CFG, NOW)
    assert [(d.kind, d.victim.id) for d in out] == [("reserve", "now")]


def test_an_overdue_victim_is_no_promise_while_the_sla_can_be_met() -> None:
    # its estimate has passed (a cold load, a slow run): it may run on for long
    overdue = victim("overdue", "a", ran_s=40, left_s=-10)
    out = plan([Waiting("p0", 0, 40, start_by_ms=NOW + 150)], [overdue, victim("b", "b", left_s=60)],
               [], set(), CFG, NOW)
    assert [d.kind for d in out] == ["yield"]


def test_once_the_start_by_time_has_passed_an_end_within_the_grace_is_waited_for() -> None:
    w = Waiting("p0", 0, 40, start_by_ms=NOW - 500)  # already late: a yield saves no SLA
    out = plan([w], [victim("soon", "a", left_s=10), victim("long", "b", left_s=300)], [], set(), CFG, NOW)
    assert [(d.kind, d.victim.id) for d in out] == [("reserve", "soon")]


def test_once_the_start_by_time_has_passed_an_end_later_than_a_yield_is_not_waited_for() -> None:
    """Found by an operator: a P0 task late by a moment waited up to max_wait_s (30 s) for a
    natural end where a victim asked to yield gives way within its grace (10 s) at most."""
    w = Waiting("p0", 0, 40, start_by_ms=NOW - 500)
    out = plan([w], [victim("v", "a", left_s=20)], [], set(), CFG, NOW)
    assert [(d.kind, d.victim.id) for d in out] == [("yield", "v")]


def test_a_young_victim_is_asked_once_of_age_rather_than_waited_for_to_its_end() -> None:
    """Found by an operator: a P0 task enqueued 0.3 s after a 25 s P3 task started waited
    for its end (the victim too young to ask, its end within max_wait_s), while one behind
    a 60 s task (beyond max_wait_s) had it yield once it ran its minimum: 25 s against 1 s.
    A victim that may be asked, plus the grace, before its natural end is not waited for:
    the plan decides nothing until it may be asked (quiet_until), then asks it."""
    young = victim("young", "a", ran_s=1, left_s=24)  # may be asked 4 s from now (minimum 5 s)
    w = Waiting("p0", 0, 40, start_by_ms=NOW + 200)
    assert plan([w], [young], [], set(), CFG, NOW) == []
    at = quiet_until([w], [young], [], set(), CFG, now_ms=NOW)
    assert at == NOW + 4000
    out = plan([w], [young], [], set(), CFG, at)
    assert [(d.kind, d.victim.id) for d in out] == [("yield", "young")]


def test_past_the_start_by_time_an_overdue_victim_is_asked_not_waited_for() -> None:
    """Found by an online service's owner: a batch task that outran its est_s counted as
    ending now, so a late P0 task was reserved behind it every round (ends_in_s=0.0) and
    waited for its whole run (90 s: the result wait timed out)."""
    w = Waiting("p0", 0, 40, start_by_ms=NOW - 500)
    overdue = victim("overdue", "a", ran_s=40, left_s=-20)
    assert [(d.kind, d.victim.id) for d in plan([w], [overdue], [], set(), CFG, NOW)] == [("yield", "overdue")]
    worn = replace(overdue, preemptions=2)  # may never be asked: its end is still the best bet
    assert [d.kind for d in plan([w], [worn], [], set(), CFG, NOW)] == ["reserve"]
    # a review: an end that comes within the grace was passed over for the overdue one
    soon = victim("soon", "b", left_s=5)
    assert [(d.kind, d.victim.id) for d in plan([w], [worn, soon], [], set(), CFG, NOW)] == [("reserve", "soon")]


def test_no_natural_end_is_waited_for_past_the_waiting_task_s_latest_start() -> None:
    """Found by an operator: a P0 task with a 10 s deadline was reserved behind a P3 task
    ending in 25 s and expired waiting; its latest start (deadline less estimate) bounds
    every wait."""
    w = Waiting("p0", 0, 40, start_by_ms=NOW - 500, latest_ms=NOW + 5000)
    out = plan([w], [victim("v", "a", left_s=8)], [], set(), CFG, NOW)
    assert [(d.kind, d.victim.id) for d in out] == [("yield", "v")]
    worn = victim("worn", "a", left_s=8, preemptions=2)  # may not be asked: nothing helps
    assert plan([w], [worn], [], set(), CFG, NOW) == []
    assert quiet_until([w], [worn], [], set(), CFG, now_ms=NOW) is None
    due = victim("due", "a", left_s=3, preemptions=2)
    assert [d.kind for d in plan([w], [due], [], set(), CFG, NOW)] == ["reserve"]


def test_with_nothing_interruptible_the_soonest_end_is_still_reserved() -> None:
    young = victim("young", "a", ran_s=1, left_s=10)  # under the minimum runtime
    out = plan([Waiting("p0", 0, 40, start_by_ms=NOW + 200)], [young], [], set(), CFG, NOW)
    assert [(d.kind, d.victim.id) for d in out] == [("reserve", "young")]


def test_a_task_offered_to_a_busy_holder_asks_that_holders_victim_though_a_gpu_idles() -> None:
    # an idle worker would load the model cold; the holder has it: its P3 task is asked
    victims = [victim("elsewhere", "a", left_s=50), victim("on_holder", "h", left_s=400)]
    w = Waiting("p0", 0, 40, start_by_ms=NOW + 200, offered="h")
    out = plan([w], victims, [Idle(43.0, "0123")], set(), CFG, NOW)
    assert [(d.kind, d.victim.id) for d in out] == [("yield", "on_holder")]


def test_a_holder_offer_is_not_waited_for_past_the_sla_while_a_gpu_idles() -> None:
    # the holder's task is too young to be asked and ends after the start-by time: an idle
    # worker loads the model cold once the offer lapses, so no reservation is made
    young = victim("young", "h", ran_s=1, left_s=10)
    w = Waiting("p0", 0, 40, start_by_ms=NOW + 200, offered="h")
    assert plan([w], [young], [Idle(43.0, "0123")], set(), CFG, NOW) == []
    # with no idle worker it is the usual plan: wait for the soonest natural end
    out = plan([w], [young], [], set(), CFG, NOW)
    assert [(d.kind, d.victim.id) for d in out] == [("reserve", "young")]
    # one due by the start-by time is waited for even while a GPU idles
    due = victim("due", "h", ran_s=1, left_s=0.1)
    out = plan([w], [due], [Idle(43.0, "0123")], set(), CFG, NOW)
    assert [(d.kind, d.victim.id) for d in out] == [("reserve", "due")]


def test_an_offer_to_a_worker_running_nothing_preemptible_changes_nothing() -> None:
    w = Waiting("p0", 0, 40, start_by_ms=NOW + 200, offered="idle-one")
    assert plan([w], [victim("v", "a", left_s=400)], [Idle(43.0, "0123")], set(), CFG, NOW) == []


def test_a_multi_gpu_task_is_planned_only_against_a_group_that_large() -> None:
    single = victim("v1", "single", usable_gb=300, left_s=5)
    pair = Victim("v2", 1, "pair", 3, NOW - 60_000, 160, 0, 150, "0123", gpus=2)
    out = plan([Waiting("p0", 0, 140, gpus=2)], [single, pair], [Idle(300.0, "0123")], set(), CFG, NOW)
    # the one-GPU victim ends in 5 s, yet only the pair can run the task: it is asked to yield
    assert [(d.kind, d.victim.worker) for d in out] == [("yield", "pair")]
    assert plan([Waiting("p0", 0, 140, gpus=4)], [single, pair], [], set(), CFG, NOW) == []


def test_a_task_whose_tenant_is_at_its_cap_takes_only_its_own_tenants_room() -> None:
    """Found by a QA pass: tenant A at max_gpus 1 waited with a P0 task; the planner asked
    tenant B's task to yield, which freed a GPU A's task could not start on, then asked A's
    own. Only a victim of A's whose end gives back enough of A's limit makes room."""
    a_cap = {"A": Limits(max_gpus=1, gpus=1, vram_gb=16, tasks=1)}
    b_task = replace(victim("b-task", "w1", left_s=50), charge=("B", 16.0, 1))
    a_task = replace(victim("a-task", "w2", left_s=60), charge=("A", 16.0, 1))
    uncharged = victim("plain", "w3", left_s=40)
    waiting = Waiting("a-p0", 0, 16, tenant="A")
    out = plan([waiting], [b_task, a_task, uncharged], [], set(), CFG, NOW, a_cap)
    assert [(d.kind, d.victim.id) for d in out] == [("yield", "a-task")]
    # nothing of A's running: nothing to ask (no yield for nothing, no reservation either)
    assert plan([waiting], [b_task, uncharged], [], set(), CFG, NOW, a_cap) == []
    # within its limits the tenant is planned for as before (the soonest end)
    roomy = {"A": Limits(max_gpus=2, gpus=1, vram_gb=16, tasks=1)}
    assert [d.victim.id for d in plan([waiting], [b_task, a_task, uncharged], [], set(), CFG, NOW,
                                      roomy)] == ["plain"]
    # a victim of A's too small to give back the room the waiting task needs (VRAM cap)
    vram_cap = {"A": Limits(max_vram_gb=40, gpus=1, vram_gb=30, tasks=1)}
    small = replace(a_task, charge=("A", 10.0, 1))
    assert plan([Waiting("a-big", 0, 30, tenant="A")], [small], [], set(), CFG, NOW, vram_cap) == []


def test_an_idle_worker_does_not_stop_the_plan_for_a_task_its_tenant_limit_holds_back() -> None:
    a_cap = {"A": Limits(bound=1, gpus=1, vram_gb=16, tasks=1)}  # the tenants' room bound
    a_task = replace(victim("a-task", "w2", left_s=60), charge=("A", 16.0, 1))
    out = plan([Waiting("a-p0", 0, 16, tenant="A")], [a_task], [Idle(75.0, "0123")], set(), CFG,
               NOW, a_cap)
    assert [(d.kind, d.victim.id) for d in out] == [("yield", "a-task")]


def test_two_waiting_tasks_of_one_tenant_do_not_count_on_the_same_room() -> None:
    # A runs one task under max_gpus 2: one more may start, so a second waiting task needs
    # one of A's own to end
    limits = {"A": Limits(max_gpus=2, gpus=1, vram_gb=16, tasks=1)}
    b1 = replace(victim("b1", "w1", left_s=50), charge=("B", 16.0, 1))
    b2 = replace(victim("b2", "w3", left_s=55), charge=("B", 16.0, 1))
    a1 = replace(victim("a1", "w2", left_s=300), charge=("A", 16.0, 1))
    waiting = [Waiting("x", 0, 16, tenant="A"), Waiting("y", 0, 16, tenant="A")]
    out = plan(waiting, [b1, b2, a1], [], set(), CFG, NOW, limits)
    assert [(d.waiting.id, d.victim.id) for d in out] == [("x", "b1"), ("y", "a1")]


def group_victim(vid: str, *, left_s: float, ran_s: float = 60, gpus: int = 2) -> Victim:
    """One of two 70 GB tasks a two-GPU group of 150 usable GB runs: its end alone frees 70."""
    return replace(victim(vid, "g2", left_s=left_s, ran_s=ran_s, usable_gb=80), gpus=gpus, freed_gb=70)


def test_where_no_one_victims_end_makes_room_the_fewest_that_do_are_asked_together() -> None:
    """Regression: a P0 task needing a whole group, whose two running P2 tasks each free only
    half of it, got no plan and waited for both to end on their own (47.6 s by hand)."""
    a, b = group_victim("a", left_s=300), group_victim("b", left_s=100)
    out = plan([Waiting("wide", 0, 140, gpus=2)], [a, b], [], set(), CFG, NOW)
    assert [(d.kind, [v.id for v in d.victims]) for d in out] == [("yield", ["b", "a"])]
    assert out[0].ends_in_s == 300  # the room is there once the last of them ends
    # both due soon: waited for, both, nothing interrupted
    soon = plan([Waiting("wide", 0, 140, gpus=2)], [replace(a, est_s=70), replace(b, est_s=65)],
                [], set(), CFG, NOW)
    assert [(d.kind, [v.id for v in d.victims]) for d in soon] == [("reserve", ["b", "a"])]
    # one of them too young to be asked: the set may not be asked; its end is more than
    # max_wait away, so nothing is decided
    assert plan([Waiting("wide", 0, 140, gpus=2)], [a, replace(b, started_ms=NOW - 1000)], [],
                set(), CFG, NOW) == []


def test_a_set_is_the_fewest_victims_and_only_where_no_single_one_fits() -> None:
    three = [replace(group_victim(v, left_s=s), freed_gb=40) for v, s in (("x", 200), ("y", 100), ("z", 300))]
    # 80 GB room once y ends; with x too 120: two are enough for 110 GB, z keeps running
    out = plan([Waiting("w", 0, 110, gpus=2)], three, [], set(), CFG, NOW)
    assert [[v.id for v in d.victims] for d in out] == [["y", "x"]]
    # a single victim on another worker that makes room alone is preferred when it ends sooner
    alone = replace(victim("solo", "big", left_s=50, usable_gb=160), gpus=2)
    out = plan([Waiting("w", 0, 110, gpus=2)], [*three, alone], [], set(), CFG, NOW)
    assert [[v.id for v in d.victims] for d in out] == [["solo"]]
    # not even all of them together: no plan
    assert plan([Waiting("w", 0, 200, gpus=2)], three, [], set(), CFG, NOW) == []


def test_a_victim_at_preempt_max_in_a_set_does_not_keep_the_others_from_being_asked() -> None:
    """Regression: three 25 GB P2 tasks on one 80 GB worker (--concurrency 3) and a P0 task
    needing 45 GB: the soonest-ending one was at preempt_max, so the set of the two soonest
    could not be asked, and the two others, which together made room, were never tried; the
    P0 task waited 15 s for the worn one to end (by hand, time scale 0.1)."""
    worn = replace(victim("worn", "w3", left_s=200, usable_gb=75), preemptions=2)
    worn = replace(worn, room_gb=25, freed_gb=25)
    b = replace(victim("b", "w3", left_s=500, usable_gb=75), room_gb=25, freed_gb=25)
    c = replace(victim("c", "w3", left_s=600, usable_gb=75), room_gb=25, freed_gb=25)
    out = plan([Waiting("p0", 0, 45)], [worn, b, c], [], set(), CFG, NOW)
    assert [(d.kind, [v.id for v in d.victims]) for d in out] == [("yield", ["b", "c"])]
    # the same with the others too young yet: nothing now, a pass once they may be asked
    young = [replace(v, started_ms=NOW - 500) for v in (b, c)]
    assert plan([Waiting("p0", 0, 45)], [worn, *young], [], set(), CFG, NOW) == []
    at = quiet_until([Waiting("p0", 0, 45)], [worn, *young], [], set(), CFG)
    assert at is not None and at <= NOW - 500 + int(CFG.preempt_min_runtime_s * 1000)
    assert [d.kind for d in plan([Waiting("p0", 0, 45)], [worn, *young], [], set(), CFG, at)] == ["yield"]


def test_a_set_of_every_task_sharing_a_models_weights_frees_the_weights_too() -> None:
    """Regression: two 35 GB P2 tasks of one model sharing its weights (35 GB, loaded once)
    on an 80 GB worker with two slots (75 usable, 40 free) and a P0 task needing 60 GB: no
    one end frees anything and the set's room left the shared weights out, so nothing was
    planned and the P0 task waited 26.5 s (by hand, time scale 0.1) though both ends free 75."""
    shared = [replace(victim(v, "w2", left_s=s), room_gb=40, freed_gb=0, model="m",
                      shared_gb=35, sharers=2) for v, s in (("a", 300), ("b", 400))]
    out = plan([Waiting("p0", 0, 60)], shared, [], set(), CFG, NOW)
    assert [(d.kind, [v.id for v in d.victims]) for d in out] == [("yield", ["a", "b"])]
    # a third sharer that is not a victim (another priority's, say) keeps the weights
    kept = [replace(v, sharers=3) for v in shared]
    assert plan([Waiting("p0", 0, 60)], kept, [], set(), CFG, NOW) == []


def test_no_room_is_planned_on_a_worker_skipping_the_tasks_model_until_its_skip_ends() -> None:
    """Regression: the planner reserved the worker whose victim ended first although its
    claims skipped the waiting task's model (its load failed there): the task reached it
    and was passed on unloaded."""
    victims = [victim("soon", "a", left_s=10), victim("later", "b", left_s=20)]
    w = Waiting("p0", 0, 40, model="m", skipped_by=(("a", NOW + 5_000),))
    assert [d.victim.id for d in plan([w], victims, [], set(), CFG, NOW)] == ["later"]
    assert [d.victim.id for d in plan([w], victims, [], set(), CFG, NOW + 5_000)] == ["soon"]
    alone = [victims[0]]  # nothing else could make room: nothing is planned until the end
    assert plan([w], alone, [], set(), CFG, NOW) == []
    assert quiet_until([w], alone, [], set(), CFG) == NOW + 5_000


def test_an_idle_worker_skipping_the_tasks_model_does_not_keep_room_from_being_planned() -> None:
    """Regression: the planner counted an idle worker whose claims skip the waiting task's
    model (its load failed there) as one that would claim it: a P0 task whose model only
    skipping workers idled on waited with no preemption planned."""
    w = Waiting("p0", 0, 40, model="m")
    victims = [victim("v", "a", left_s=300)]
    skipper = Idle(43.0, "0123", 1, (("m", NOW + 15_000),))
    assert [(d.kind, d.victim.id) for d in plan([w], victims, [skipper], set(), CFG, NOW)] == [("yield", "v")]
    assert plan([w], victims, [skipper], set(), CFG, NOW + 15_000) == []  # its skip over: it takes w
    assert plan([w], victims, [skipper._replace(skips=(("n", NOW + 15_000),))], set(), CFG, NOW) == []
    # a victim too young to be asked: the plan waits, and looks again once it may be asked
    young = [victim("young", "a", ran_s=1, left_s=300)]
    assert plan([w], young, [skipper], set(), CFG, NOW) == []
    assert quiet_until([w], young, [skipper], set(), CFG) == NOW + 4_000


def test_idle_workers_skipping_models_stand_alone_only_where_their_skips_were_read() -> None:
    a, b = Idle(43.0, "0123"), Idle(20.0, "0123")
    shapes = {a: ["s1", "s2"], b: [f"w{i}" for i in range(10)]}
    # b is too small for the task: its workers' skips change nothing and are not read
    assert idle_to_read(shapes, [Waiting("p0", 0, 40, model="m")]) == ["s1", "s2"]
    first8 = [f"w{i}" for i in range(8)]
    assert idle_to_read(shapes, [Waiting("p0", 0, 10, model="m")]) == ["s1", "s2", *first8]
    ends = {"m": NOW + 1}
    # both of a's workers skip: a stands only as them; one of b's skips: b stays as well
    assert split_idle(shapes, {"s1": ends, "s2": ends, "w0": ends, "w1": {}}) == [
        a._replace(skips=(("m", NOW + 1),)), b, b._replace(skips=(("m", NOW + 1),))]
    # one of a's skips none: a stays; b's unread workers may skip none: b stays
    skips = {"s1": ends, "s2": {}, **{f"w{i}": ends for i in range(8)}}
    assert split_idle(shapes, skips) == [a, a._replace(skips=(("m", NOW + 1),)), b,
                                         b._replace(skips=(("m", NOW + 1),))]


def test_no_room_is_planned_on_a_worker_whose_app_lacks_the_waiting_tasks_handler() -> None:
    """A worker without the handler passes the task on unrun (or fails it where no live
    worker runs it: a typo); interrupting its batch work, or an idle worker's presence,
    helps the task nothing."""
    runs_it, lacks_it = frozenset({"llm.generate"}), frozenset({"embed"})
    victims = [replace(victim("other-app", "a", left_s=100), handlers=lacks_it),
               replace(victim("same-app", "b", left_s=300), handlers=runs_it)]
    w = Waiting("p0", 0, 40, handler="llm.generate")
    assert [d.victim.id for d in plan([w], victims, [], set(), CFG, NOW)] == ["same-app"]
    typo = replace(w, handler="llm.generat")
    assert plan([typo], victims, [], set(), CFG, NOW) == []
    assert quiet_until([typo], victims, [], set(), CFG) is None
    # an idle worker of the other app does not take it either: the holder is still planned for
    idle = [Idle(43.0, "0123", handlers=lacks_it)]
    assert [d.victim.id for d in plan([w], victims, idle, set(), CFG, NOW)] == ["same-app"]
    assert plan([w], victims, [Idle(43.0, "0123", handlers=runs_it)], set(), CFG, NOW) == []
    # a worker that publishes no handlers (a simulated one) runs whatever it claims
    assert [d.victim.id for d in plan([typo], [victim("v", "a", left_s=100)], [], set(), CFG, NOW)] == ["v"]
