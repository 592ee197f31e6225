"""The reaper's memory of live workers. The scaler's: each one's fixed fields read once per
start, its state every round (given the leases: when its lease moved, and REFRESH more); a
worker started again under its id read in full again. The planner's: GPU fields read
once, all again after any registration."""

from __future__ import annotations

import time

from helpers import claim, enqueue
from helpers import register_worker as register

from gpuq import Queue
from gpuq.reaper.known_workers import KnownWorkers
from gpuq.reaper.preempt import Idle, Preemptor


def records(q: Queue, known: KnownWorkers, live: list[str]) -> dict[str, tuple[str, str, str] | None]:
    pipe = q.redis.pipeline(transaction=False)
    known.read(pipe, q.keys, live)
    got = known.records(q.redis, q.keys, live, iter(pipe.execute()))
    return {w: None if r is None else (r.gpu_name, r.levels, r.state) for w, r in zip(live, got)}


def test_fixed_fields_are_read_once_a_start_and_the_state_every_round(queue: Queue) -> None:
    register(queue, "a", "A100-80", 80, levels="0123")
    register(queue, "b", "L4-24", 24, levels="01")
    known = KnownWorkers()
    assert records(queue, known, ["a", "b"]) == {"a": ("A100-80", "0123", "idle"),
                                                 "b": ("L4-24", "01", "idle")}
    # a hand edit of a fixed field is not read again while the worker runs; its state is
    queue.redis.hset(queue.keys.worker("a"), mapping={"levels": "3", "state": "draining"})
    assert records(queue, known, ["a", "b"])["a"] == ("A100-80", "0123", "draining")


def test_with_leases_a_state_is_read_when_its_lease_moved_or_in_the_refresh(queue: Queue) -> None:
    """A beat renews the lease and rewrites the state: a worker whose lease stayed is read
    only among the REFRESH read longest ago (a state written without a beat: retire.lua's)."""
    register(queue, "a", "A100-80", 80)
    register(queue, "b", "A100-80", 80)
    known = KnownWorkers(refresh=1)

    def states(leases: dict[str, float]) -> dict[str, str]:
        pipe = queue.redis.pipeline(transaction=False)
        known.read(pipe, queue.keys, ["a", "b"], leases)
        got = known.records(queue.redis, queue.keys, ["a", "b"], iter(pipe.execute()))
        return {w: r.state for w, r in zip(["a", "b"], got) if r is not None}

    assert states({"a": 1.0, "b": 1.0}) == {"a": "idle", "b": "idle"}  # new: read in full
    for w in ("a", "b"):
        queue.redis.hset(queue.keys.worker(w), "state", "retiring")
    assert states({"a": 1.0, "b": 1.0}) == {"a": "retiring", "b": "idle"}  # a: the refresh
    assert states({"a": 1.0, "b": 1.0}) == {"a": "retiring", "b": "retiring"}  # b's turn
    queue.redis.hset(queue.keys.worker("b"), "state", "draining")
    queue.redis.hset(queue.keys.worker("a"), "state", "busy")
    # b's lease moved (a beat): read at once; a, read longest ago, is the refresh
    assert states({"a": 1.0, "b": 2.0}) == {"a": "busy", "b": "draining"}


def test_a_worker_started_again_under_its_id_is_read_in_full(queue: Queue) -> None:
    register(queue, "a", "A100-80", 80)
    known = KnownWorkers()
    records(queue, known, ["a"])
    queue.redis.hset(queue.keys.worker("a"), mapping={"gpu_name": "H100-80", "levels": "01",
                                                     "started_at": "1"})  # a new start
    assert records(queue, known, ["a"]) == {"a": ("H100-80", "01", "idle")}


def test_a_gone_hash_reads_none_and_workers_no_longer_live_are_forgotten(queue: Queue) -> None:
    register(queue, "a", "A100-80", 80)
    register(queue, "b", "A100-80", 80)
    known = KnownWorkers()
    records(queue, known, ["a", "b"])
    queue.redis.delete(queue.keys.worker("a"))  # being reaped
    assert records(queue, known, ["a", "b"])["a"] is None
    records(queue, known, ["b"])
    assert set(known.kept) == {"b"}


def test_the_planner_reads_a_worker_started_again_under_its_id_afresh(queue: Queue) -> None:
    """A worker restarted under its id while its last lease still runs (a fixed --name) may
    be another GPU or serve other levels: the planner must not plan from the old start's."""
    register(queue, "w1", "A100", 80, idle=True)
    planner = Preemptor(queue.redis, queue.keys, queue.config, queue.scripts, queue.calls)
    now = int(time.time() * 1000)
    h = frozenset({"h"})
    assert planner.read_workers(now)[1] == [Idle(75.0, "0123", 1, handlers=h)]
    assert planner.read_workers(now)[1] == [Idle(75.0, "0123", 1, handlers=h)]  # kept: not read again
    register(queue, "w1", "L4", 24, idle=True, levels="01")  # started again, still live
    assert planner.read_workers(now)[1] == [Idle(19.0, "01", 1, handlers=h)]


def test_the_planner_takes_a_reservation_as_live_only_within_the_claims_gate(queue: Queue) -> None:
    """The pool's `reserved_until` gate is at or past every reservation's expiry (preempt.lua
    moves it with each one); a claim past it reads no reservation key, and the planner, which
    skips the read of every live worker's key there, takes none as live either."""
    register(queue, "w1", "A100", 80, idle=True)
    planner = Preemptor(queue.redis, queue.keys, queue.config, queue.scripts, queue.calls)
    now = int(time.time() * 1000)
    queue.redis.set(queue.keys.reservation("w1"), f"t1 {now + 60_000}")  # no gate moved with it
    queue.redis.hset(queue.keys.fairness, "reserved_until", str(now - 1))
    assert planner.read_workers(now)[2] == set()
    assert planner.reservations_end is None
    queue.redis.hset(queue.keys.fairness, "reserved_until", str(now + 60_000))
    assert planner.read_workers(now)[2] == {"w1"}
    assert planner.reservations_end == now + 60_000


def test_the_planner_takes_no_victim_on_a_worker_on_its_way_out(queue: Queue) -> None:
    """Found by an operator's pass: the planner asked the task of a draining worker to yield
    for a P0 task; the drain's task gave way (a drain promises it its end) and the worker
    left, freeing a GPU nobody could use, so a second victim was asked 0.7 s later."""
    now = int(time.time() * 1000)
    for w in ("d1", "d2"):
        register(queue, w, "A100", 80, idle=True)
        enqueue(queue, now, model="m", vram_gb=10, est_s=800)
        assert claim(queue, w, 75, now_ms=now) is not None
    planner = Preemptor(queue.redis, queue.keys, queue.config, queue.scripts, queue.calls)
    assert sorted(v.worker for v in planner.read_workers(now)[0]) == ["d1", "d2"]
    queue.redis.hset(queue.keys.worker("d1"), "state", "draining")
    assert [v.worker for v in planner.read_workers(now)[0]] == ["d2"]
    queue.redis.hset(queue.keys.worker("d2"), "state", "retiring")
    assert planner.read_workers(now)[0] == []
