"""The room kept for tenants' recent demand (gpuq.reaper.tenant_room.plan_bounds)."""

from __future__ import annotations

from gpuq.reaper.tenant_room import plan_bounds


def test_a_lone_tenant_with_demand_borrows_every_worker() -> None:
    assert plan_bounds({"a": 12.0}, {}, 8, 1.0, {"a", "b"}) == {}
    assert plan_bounds({"a": 12.0, "b": 0.01}, {}, 8, 1.0, {"a", "b"}) == {}  # b's decayed tail


def test_others_keep_room_for_their_demand_and_headroom_up_to_their_share() -> None:
    # b offers 1.2 workers of work: room for ceil(1.2 + sqrt(1.2)) = 3; a's share (4) caps a's
    assert plan_bounds({"a": 12.0, "b": 1.2}, {}, 8, 1.0, {"a", "b"}) == {"a": 5, "b": 4}
    # half the headroom: ceil(1.2 + 0.5 x 1.1) = 2
    assert plan_bounds({"a": 12.0, "b": 1.2}, {}, 8, 0.5, {"a", "b"}) == {"a": 6, "b": 4}
    # a heavier tenant needs less headroom for its size: 16 + 4 = 20 of a share of 32
    assert plan_bounds({"a": 100.0, "b": 16.0}, {}, 64, 1.0, {"a", "b"}) == {"a": 44, "b": 32}
    # weights set the shares: b may keep up to 1/4 of 8
    assert plan_bounds({"a": 12.0, "b": 30.0}, {"a": 3.0, "b": 1.0}, 8, 1.0, {"a", "b"}) == \
        {"a": 6, "b": 2}


def test_a_tenant_may_always_run_its_share_and_at_least_one() -> None:
    demand = {"a": 50.0, "b": 50.0, "c": 50.0}
    bounds = plan_bounds(demand, {}, 8, 1.0, {"a", "b", "c", "d"})
    # each keeps room for its share (8/3): the others may use 8 - 2 x 8/3, floored
    assert bounds == {"a": 2, "b": 2, "c": 2, "d": 1}


def test_no_headroom_keeps_no_room() -> None:
    assert plan_bounds({"a": 12.0, "b": 1.2}, {}, 8, 0.0, {"a", "b"}) == {}
    assert plan_bounds({"a": 12.0, "b": 1.2}, {}, 0, 1.0, {"a", "b"}) == {}
