"""Contract suite: a worker whose claims skip a model after its load failed there
(gpuq/worker/broken.py) is passed over by the offers of that model's tasks, at enqueue and in
other workers' claims, until the skip ends (lib/lanes.lua). Each test runs on fakeredis and on
the real server (the ``backend`` fixture)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
from helpers import T0, claim_reply, enqueue, register_worker

from gpuq import App, Queue, worker_record
from gpuq.claims import ClaimRequest
from gpuq.reaper.preempt import Preemptor
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.models import ModelCache
from gpuq.worker.presence import Presence

LEASE_MS, DEFER_MS, FAIR_EVERY = 30_000, 2_000, 5


def idle(q: Queue, wid: str, free_gb: float, skipped: Sequence[tuple[str, int]] = (),
         register: bool = True) -> None:
    """A one-slot worker as presence writes it, whose claim (skipping ``skipped``) found nothing."""
    if register:
        gpu = GpuInfo("L4", f"uuid-{wid}", 24, None, "declared")
        fields = worker_record.identity(wid, gpu, 5.0, 1, "0123", "h", 1, (DEFER_MS, FAIR_EVERY, LEASE_MS))
        Presence(q.redis, q.keys, wid).register(fields, LEASE_MS)
    req = ClaimRequest(wid, free_gb, 0, 1, skipped=tuple(skipped))
    assert q.scripts.run(q.calls.claim(req, now_ms=T0)).task is None


def test_enqueue_does_not_hand_a_task_to_a_worker_skipping_its_model(queue: Queue) -> None:
    """Regression: enqueue handed a task to the tightest idle worker although that worker's
    claims skipped the task's model (its load had failed there): the task was passed on
    unloaded, 1 s in the delayed set, while another idle worker could have run it."""
    idle(queue, "skipper", 10, [("m", 30_000)])  # the tighter fit for a 4 GB task
    idle(queue, "other", 19)
    first = enqueue(queue, T0 + 10, model="m", vram_gb=4)
    assert queue.record(first).worker == "other"
    idle(queue, "other", 19, register=False)
    assert queue.record(enqueue(queue, T0 + 20, model="n", vram_gb=4)).worker == "skipper"  # n: not skipped
    idle(queue, "skipper", 10, [("m", 30_000)], register=False)
    # past the skip's end the tighter fit is offered m's tasks again (a stale entry is passed over)
    assert queue.record(enqueue(queue, T0 + 30_001, model="m", vram_gb=4)).worker == "skipper"


def test_a_claim_does_not_leave_a_task_for_a_worker_skipping_its_model(queue: Queue) -> None:
    """Regression: a claim left a cold task for a tighter idle worker that skipped its model,
    which was woken, skipped it, and the task waited out its defer bound."""
    tid = enqueue(queue, T0, model="m", vram_gb=4)  # nobody idles: queued, offered to none
    idle(queue, "skipper", 10, [("m", 30_000)])
    c = claim_reply(queue, "other", 19, now_ms=T0 + 20)
    assert c.task is not None and c.task["id"] == tid
    assert queue.redis.llen(queue.keys.wake("skipper")) == 0  # not woken for it either


def stale_holding(q: Queue, wid: str, model: str) -> None:
    """``wid`` listed among the model's holders although it dropped the model: an eviction
    whose report met an outage (gpuq.worker.presence, ``unsent``) until the next beat."""
    q.redis.sadd(q.keys.holders(model), wid)


@pytest.mark.parametrize("others", [0, 8], ids=["few idle", "many idle"])
def test_enqueue_does_not_hand_a_task_to_an_idle_holder_skipping_its_model(queue: Queue, others: int) -> None:
    """Regression: the idle holder pick (lib/few_idle.lua with at most 8 idle, else
    lib/wake.lua idle_holder) read a worker's lanes for its levels only: a worker listed
    as a holder of m while its claims skipped m was handed m's task, which it passed on."""
    idle(queue, "skipper", 10, [("m", 30_000)])
    stale_holding(queue, "skipper", "m")
    idle(queue, "other", 19)
    for i in range(others):  # roomier than "other": the tightest fit stays "other"
        idle(queue, f"big{i}", 23)
    tid = enqueue(queue, T0 + 10, model="m", vram_gb=4)
    assert queue.record(tid).worker == "other"
    assert queue.redis.llen(queue.keys.wake("skipper")) == 0


def test_a_claim_does_not_leave_a_task_for_an_idle_holder_skipping_its_model(queue: Queue) -> None:
    """Regression: a claim left a cold task for an idle holder of its model that skipped it
    (better_elsewhere: idle_holder), woke it, and the task waited out its defer bound."""
    tid = enqueue(queue, T0, model="m", vram_gb=4)  # nobody idles: queued, offered to none
    idle(queue, "skipper", 10, [("m", 30_000)])
    stale_holding(queue, "skipper", "m")
    c = claim_reply(queue, "other", 19, now_ms=T0 + 20)
    assert c.task is not None and c.task["id"] == tid
    assert queue.redis.llen(queue.keys.wake("skipper")) == 0


def test_an_idle_holder_whose_skip_ended_is_offered_its_model_again(queue: Queue) -> None:
    idle(queue, "holder", 10, [("m", 30_000)])
    stale_holding(queue, "holder", "m")  # held again (loaded since): listed, and its skip over
    idle(queue, "other", 9)
    tid = enqueue(queue, T0 + 30_001, model="m", vram_gb=4)
    assert queue.record(tid).worker == "holder"


def test_a_restored_worker_still_lists_the_models_its_claims_skip(queue: Queue) -> None:
    """Regression: Presence.restore (a worker revived after the reaper took it for dead, or
    after Redis lost its data) rewrote the worker's lane as its levels alone: a runner's claim
    had listed it idle again, skipping m, and enqueue handed it m's tasks until its next claim."""
    gpu = GpuInfo("L4", "uuid-skipper", 24, None, "declared")
    presence = Presence(queue.redis, queue.keys, "skipper")
    presence.register(worker_record.identity("skipper", gpu, 5.0, 1, "0123", "h", 1,
                                             (DEFER_MS, FAIR_EVERY, LEASE_MS)), LEASE_MS)
    idle(queue, "skipper", 10, [("m", 30_000)], register=False)
    idle(queue, "other", 19)
    queue.redis.zrem(queue.keys.workers, "skipper")  # taken for dead after that claim
    presence.restore(ModelCache(App("a"), 24, 5.0), [("m", 30_000)])
    tid = enqueue(queue, T0 + 10, model="m", vram_gb=4)
    assert queue.record(tid).worker == "other"


def test_the_planner_plans_no_room_on_a_worker_skipping_the_waiting_tasks_model(queue: Queue) -> None:
    """Regression: the preemption planner weighed every running victim whatever its worker's
    claims skipped: a P0 task of m got a reservation on the worker whose batch task ended
    first although that worker skipped m (its load had failed there), which then passed the
    task on unloaded while another worker's victim was about to make room."""
    now = int(time.time() * 1000)  # the planner reads the server's clock
    for wid in ("skipper", "other"):
        register_worker(queue, wid, "A100", 80)
        queue.redis.delete(queue.keys.worker_tasks(wid))  # runs only what it claims below
    request = ClaimRequest("skipper", 75, 0, 1, skipped=[("m", 60_000)])
    assert queue.scripts.run(queue.calls.claim(request, now_ms=now - 2_000)).task is None  # lists m
    for wid, est_s in (("skipper", 20), ("other", 25)):  # the skipper's victim ends first
        tid = enqueue(queue, now - 1_000, model="x", vram_gb=40, priority="P3", est_s=est_s)
        skipped = [("m", 60_000)] if wid == "skipper" else []
        got = queue.scripts.run(queue.calls.claim(ClaimRequest(wid, 75, 0, 1, skipped=skipped),
                                                  now_ms=now - 1_000))
        assert got.task is not None and got.task["id"] == tid
        # loaded and started: a victim still loading is not asked, and its end is not waited
        # for where it may be asked, once started, before that end could come
        queue.scripts.run(queue.calls.began(tid, int(got.task["token"]), now_ms=now - 1_000))
    urgent = enqueue(queue, now, model="m", vram_gb=40, priority="P0", est_s=5)
    planner = Preemptor(queue.redis, queue.keys, queue.config, queue.scripts, queue.calls)
    assert sum(planner.step(now).values()) == 1  # a yield asked (or a wait) on one worker
    assert queue.redis.hget(queue.keys.task(urgent), "reserved_for") == "other"


def test_the_planner_makes_room_for_a_task_whose_model_the_only_idle_worker_skips(queue: Queue) -> None:
    """Regression: the planner took any idle worker with room for a waiting task as one
    that would claim it: with only a worker skipping the task's model idle (its load had
    failed there), a P0 task of that model waited with no room planned on a busy worker."""
    now = int(time.time() * 1000)  # the planner reads the server's clock
    for wid in ("skipper", "busy"):
        register_worker(queue, wid, "A100", 80)
        queue.redis.delete(queue.keys.worker_tasks(wid))  # runs only what it claims below
    tid = enqueue(queue, now - 10_000, model="x", vram_gb=40, priority="P3", est_s=300)
    got = queue.scripts.run(queue.calls.claim(ClaimRequest("busy", 75, 0, 1), now_ms=now - 10_000))
    assert got.task is not None and got.task["id"] == tid
    queue.scripts.run(queue.calls.began(tid, int(got.task["token"]), now_ms=now - 9_000))  # loaded
    request = ClaimRequest("skipper", 75, 0, 1, skipped=[("m", 60_000)])
    assert queue.scripts.run(queue.calls.claim(request, now_ms=now - 1_000)).task is None  # idle, lists m
    urgent = enqueue(queue, now, model="m", vram_gb=40, priority="P0", est_s=5)
    assert queue.redis.llen(queue.keys.wake("skipper")) == 0  # not offered to the skipper
    planner = Preemptor(queue.redis, queue.keys, queue.config, queue.scripts, queue.calls)
    assert planner.step(now) == {"yield": 1}
    assert queue.redis.hget(queue.keys.task(urgent), "reserved_for") == "busy"


def test_a_claim_does_not_wake_a_worker_skipping_the_model_of_a_task_too_big_for_it(queue: Queue) -> None:
    """Regression: a claim that found a task too big for its worker woke the idle worker it
    fits most tightly whatever that worker skipped: one skipping the task's model was woken,
    passed the task over, and the task waited for another wake-up."""
    tid = enqueue(queue, T0, model="m", vram_gb=15)  # nobody idles: queued, offered to none
    idle(queue, "skipper", 18, [("m", 30_000)])
    register_worker(queue, "other", "L4", 24)
    queue.redis.zadd(queue.keys.idle, {"other": 22})  # idle, its wake-up not yet acted on
    assert claim_reply(queue, "small", 10, now_ms=T0 + 20).task is None
    assert queue.redis.llen(queue.keys.wake("skipper")) == 0
    assert queue.redis.llen(queue.keys.wake("other")) == 1
    got = claim_reply(queue, "other", 22, now_ms=T0 + 30)
    assert got.task is not None and got.task["id"] == tid
