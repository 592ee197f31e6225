"""Multi-GPU workers and tasks against the scripts: a task asking N GPUs runs only on a group of
at least N, one-GPU work leaves a group free while a one-GPU worker fits it, enqueue's check
refuses what no group could hold, and bad counts are refused at the boundary."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import (
    T0,
    claim,
    claim_batch,
    claim_reply,
    enqueue,
    pool_keys,
    raw_enqueue_call,
    register_worker,
    reserve,
)

from gpuq import Queue, shapes
from gpuq.errors import InvalidTask, Unschedulable
from gpuq.reaper.scale import Scaler
from gpuq.task import State, TaskSpec


def test_a_multi_gpu_task_runs_only_on_a_group_that_large(queue: Queue) -> None:
    tid = enqueue(queue, T0, model="llama-70b", vram_gb=140, gpus=2)
    assert queue.redis.hget(queue.keys.task(tid), "gpus") == "2"
    # a single GPU with room for its VRAM still lacks the devices it shards over
    assert claim(queue, "big-single", 300, now_ms=T0 + 1) is None
    assert claim(queue, "pair", 150, now_ms=T0 + 2, gpus=2)["id"] == tid
    assert queue.record(tid).gpus == 2


def test_a_one_gpu_task_is_stored_without_a_gpus_field(queue: Queue) -> None:
    tid = enqueue(queue, T0)
    assert queue.redis.hget(queue.keys.task(tid), "gpus") is None
    assert queue.record(tid).gpus == 1


def test_the_unfit_claim_wakes_a_group_that_holds_the_task(queue: Queue) -> None:
    register_worker(queue, "quad", gpus=4, idle=True)
    tid = enqueue(queue, T0, model="llama-70b", vram_gb=140, gpus=4)
    queue.redis.delete(queue.keys.wake("quad"))
    queue.redis.zadd(queue.keys.idle, {"quad": 300})  # the enqueue's wake took it out
    assert claim(queue, "single", 300, now_ms=T0 + 1) is None
    assert queue.redis.lrange(queue.keys.wake("quad"), 0, -1) == ["1"]
    assert claim(queue, "quad", 300, now_ms=T0 + 2, gpus=4)["id"] == tid


def test_enqueue_offers_a_multi_gpu_task_to_a_group_not_to_a_single_gpu(queue: Queue) -> None:
    register_worker(queue, "single", device_gb=200, idle=True)  # VRAM enough, one device
    register_worker(queue, "pair", gpus=2, idle=True)
    tid = enqueue(queue, T0, model="llama-70b", vram_gb=140, gpus=2)
    assert queue.redis.hget(queue.keys.task(tid), "offered") == "pair"


def test_a_group_is_found_behind_many_single_gpus_that_fit_the_vram(queue: Queue) -> None:
    """Regression: the wake rule read only the 8 tightest idle workers: with 8 one-GPU
    workers of 187 GB idle, a 4-GPU task of 150 GB was offered to nobody, and the 4-GPU
    group found it only at its next idle look (up to 5 s: a P0 SLA missed)."""
    for i in range(12):
        register_worker(queue, f"single-{i:02d}", "B200", 192, idle=True)
    register_worker(queue, "quad", device_gb=80, gpus=4, idle=True)
    tid = enqueue(queue, T0, model="tp4", vram_gb=150, gpus=4, priority="P0")
    assert queue.redis.hget(queue.keys.task(tid), "offered") == "quad"
    assert queue.redis.lrange(queue.keys.wake("quad"), 0, -1) == ["1"]
    queue.redis.zadd(queue.keys.idle, {"quad": 300})
    queue.redis.delete(queue.keys.wake("quad"))
    assert claim(queue, "single-00", 187, now_ms=T0 + 1) is None  # the unfit claim wakes it
    assert queue.redis.lrange(queue.keys.wake("quad"), 0, -1) == ["1"]


def test_one_gpu_work_leaves_a_group_free_while_a_single_gpu_fits_it(queue: Queue) -> None:
    """Best fit by group: the tightest idle worker is the one-GPU worker, so the task is
    offered to it and the group's own claim leaves it there (until the defer bound)."""
    register_worker(queue, "single", idle=True)
    quad = register_worker(queue, "quad", gpus=4, idle=True)
    tid = enqueue(queue, T0, model="m", vram_gb=20)
    assert queue.redis.hget(queue.keys.task(tid), "offered") == "single"
    reply = claim_reply(queue, "quad", quad, now_ms=T0 + 1, gpus=4)
    assert reply.task is None and reply.retry_s > 0
    assert claim(queue, "single", 75, now_ms=T0 + 2)["id"] == tid


def test_a_group_claims_one_gpu_work_no_single_gpu_can_take(queue: Queue) -> None:
    quad = register_worker(queue, "quad", gpus=4, idle=True)
    tid = enqueue(queue, T0, model="m", vram_gb=20)
    assert claim(queue, "quad", quad, now_ms=T0 + 1, gpus=4)["id"] == tid


def test_a_reservation_for_a_larger_task_than_the_group_is_not_taken(queue: Queue) -> None:
    """The planner never makes one; a hand-made one goes and the worker claims as usual."""
    tid = enqueue(queue, T0, model="llama-70b", vram_gb=140, gpus=4, priority="P0")
    other = enqueue(queue, T0, model="m", vram_gb=20)
    reserve(queue, "pair", tid, T0 + 60_000)
    assert claim(queue, "pair", 150, now_ms=T0 + 1, gpus=2)["id"] == other
    assert queue.record(tid).state is State.QUEUED
    assert not queue.redis.exists(queue.keys.reservation("pair"))


def test_a_batch_takes_no_task_asking_more_gpus_than_its_first(queue: Queue) -> None:
    first = enqueue(queue, T0, handler="embed", model="bge", vram_gb=2)
    big = enqueue(queue, T0 + 1, handler="embed", model="bge", vram_gb=2, gpus=2)
    same = enqueue(queue, T0 + 2, handler="embed", model="bge", vram_gb=2)
    got = claim(queue, "pair", 150, now_ms=T0 + 3, gpus=2)
    assert got["id"] == first
    batch = claim_batch(queue, "pair", got, 148, now_ms=T0 + 4)
    assert [t["id"] for t in batch.tasks] == [same]
    assert queue.record(big).state is State.QUEUED


def test_check_fit_refuses_more_gpus_than_any_group_has(queue: Queue) -> None:
    register_worker(queue, "single")
    register_worker(queue, "pair", gpus=2)
    with pytest.raises(Unschedulable, match="needs 4 GPUs, the largest GPU group registered in "
                                            "this pool has 2") as err:
        queue.enqueue("h", model="llama-405b", vram_gb=300, gpus=4, check_fit=True)
    assert (err.value.gpus, err.value.most_gpus, err.value.largest_gb) == (4, 2, 0)
    with pytest.raises(Unschedulable, match="needs 200 GB of VRAM on 2 GPUs, the largest "
                                            "registered GPU class of 2\\+ GPUs offers 150 GB"):
        queue.enqueue("h", model="llama-70b", vram_gb=200, gpus=2, check_fit=True)
    t = queue.enqueue("h", model="llama-70b", vram_gb=140, gpus=2, check_fit=True)
    assert t.status() is State.QUEUED


def test_a_group_registers_its_class_with_its_shape(queue: Queue) -> None:
    register_worker(queue, "quad", gpus=4, idle=True)
    assert queue.redis.hgetall(queue.keys.classes) == {"4xA100": "300.0"}
    assert queue.redis.hgetall(queue.keys.class_gpus) == {"4xA100": "4"}
    fields = queue.redis.hgetall(queue.keys.worker("quad"))
    assert (fields["gpus"], fields["vram_total_gb"], fields["kv_reserve_gb"]) == ("4", "320", "20.0")


@pytest.mark.parametrize("raw", ["0", "65", "1.5", "x", ""])
def test_a_bad_gpu_count_is_refused_by_the_script(queue: Queue, raw: str) -> None:
    _, call = raw_enqueue_call(queue, gpus=raw)
    with pytest.raises(InvalidTask, match="gpus must be an integer in 1..64"):
        queue.scripts.run(call)
    assert pool_keys(queue) == set()


@pytest.mark.parametrize("bad", [0, 65, 1.5, True, "2"])
def test_a_bad_gpu_count_is_refused_by_the_client(bad: object) -> None:
    with pytest.raises(InvalidTask, match="gpus must be an integer in 1..64"):
        TaskSpec.build("h", model="m", vram_gb=1, gpus=bad)  # type: ignore[arg-type]


def test_scale_signals_ask_for_the_group_shape_a_70b_backlog_needs(make_real_queue: Any) -> None:
    q = make_real_queue(min_workers=0)
    register_worker(q, "single")
    register_worker(q, "pair", gpus=2)
    q.enqueue_many([{"handler": "h", "model": "llama-70b", "vram_gb": 144, "gpus": 2, "est_s": 2}
                    for _ in range(60)])
    Scaler(q.redis, q.keys, q.config).step()
    got = {k: json.loads(v) for k, v in q.redis.hgetall(q.keys.scale).items()}
    assert (got["class:2xA100"]["current"], got["class:2xA100"]["desired"]) == (1, 3)
    assert (got["class:A100"]["current"], got["class:A100"]["desired"]) == (1, 1)


def test_need_scores_a_task_by_its_shape_wherever_it_is_queued(queue: Queue) -> None:
    """`need` finds tasks no shape holds by score ranges (lua/park.lua), so every path that
    queues a task scores it by VRAM and GPUs: enqueue, and a requeue back into its queue."""
    wide = enqueue(queue, T0, model="llama-70b", vram_gb=140.5, gpus=2)
    one = enqueue(queue, T0 + 1, model="m", vram_gb=20.5)
    assert queue.redis.zscore(queue.keys.need, wide) == shapes.score(140.5, 2) == 2 * 2**40 + 140.5
    assert queue.redis.zscore(queue.keys.need, one) == 20.5
    got = claim(queue, "pair", 150, now_ms=T0 + 2, gpus=2)
    assert got["id"] == wide and queue.redis.zscore(queue.keys.need, wide) is None
    assert queue.scripts.run(queue.calls.requeue(wide, int(got["token"]), "shutdown", now_ms=T0 + 3)) \
        == "queued"
    assert queue.redis.zscore(queue.keys.need, wide) == shapes.score(140.5, 2)
