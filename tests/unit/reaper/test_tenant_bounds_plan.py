"""The room kept for tenants' recent demand (gpuq.reaper.tenant_room.plan_bounds)."""

from __future__ import annotations

from gpuq.reaper.tenant_room import plan_bounds


def test_a_lone_tenant_with_demand_borrows_every_worker() -> None:
    assert plan_bounds({"a": 12.0}, {}, 8, 1.0) == {}
    assert plan_bounds({"a": 12.0, "b": 0.01}, {}, 8, 1.0) == {}  # b's decayed tail


def test_a_borrower_leaves_room_for_the_others_demand_and_headroom() -> None:
    # b offers 1.2 workers of work, within its share: unbound; a borrows 8 - (1.2 + sqrt(1.2))
    assert plan_bounds({"a": 12.0, "b": 1.2}, {}, 8, 1.0) == {"a": 5}
    assert plan_bounds({"a": 12.0, "b": 1.2}, {}, 8, 0.5) == {"a": 6}  # 1.2 + 0.55
    # a heavier tenant needs less headroom for its size: 16 + 4 of b's share of 32
    assert plan_bounds({"a": 100.0, "b": 16.0}, {}, 64, 1.0) == {"a": 44}


def test_weights_set_the_shares_and_a_borrower_may_always_run_its_own() -> None:
    # shares 6 and 2: each borrows, and keeps its share whatever the other asks
    assert plan_bounds({"a": 12.0, "b": 30.0}, {"a": 3.0, "b": 1.0}, 8, 1.0) == {"a": 6, "b": 2}
    demand = {"a": 50.0, "b": 50.0, "c": 50.0}
    assert plan_bounds(demand, {}, 8, 1.0) == {"a": 2, "b": 2, "c": 2}  # shares of 8/3


def test_tenants_within_their_shares_are_never_bound() -> None:
    # twenty light tenants: 6 workers of demand on 8, nobody borrows
    assert plan_bounds({f"t{i}": 0.3 for i in range(20)}, {}, 8, 1.0) == {}


def test_no_headroom_keeps_no_room() -> None:
    assert plan_bounds({"a": 12.0, "b": 1.2}, {}, 8, 0.0) == {}
    assert plan_bounds({"a": 12.0, "b": 1.2}, {}, 0, 1.0) == {}


def test_no_room_is_kept_for_a_tenant_past_what_its_cap_lets_run() -> None:
    """Found by a QA pass: tenant A (weight 3, max_gpus 1) and B both flooding four workers:
    the room kept for A's demand (its share, 3) left B bound to 1, so two workers idled
    while B's tasks queued. A can run 1: B may run the other 3."""
    assert plan_bounds({"a": 5.0, "b": 5.0}, {"a": 3.0}, 4, 1.0) == {"a": 3, "b": 1}
    assert plan_bounds({"a": 5.0, "b": 5.0}, {"a": 3.0}, 4, 1.0, {"a": 1}) == {"b": 3}
    assert plan_bounds({"a": 5.0, "b": 5.0}, {}, 4, 1.0, {"a": 0}) == {}  # a runs nothing: b alone
