"""What the wake rule and the busy-holder reads send (lib/wake.lua, lib/holders.lua), counted
in the real server's command stats."""

from __future__ import annotations

from conftest import MakeQueue
from helpers import T0, claim_reply, enqueue, register_worker

from gpuq import Queue


def reads(q: Queue) -> dict[str, int]:
    stats = q.redis.info("commandstats")
    return {c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hget", "hmget")}


def test_the_tightest_idle_workers_lanes_come_in_one_read(real_queue: Queue) -> None:
    """Eight idle online lanes are the tightest idle fit of a P2 task: its enqueue weighs
    them with one HMGET of their lanes, not an HGET each (one a lane, every enqueue)."""
    q = real_queue
    for i in range(8):
        register_worker(q, f"lane-{i}", idle=True, levels="0")
    before = reads(q)
    tid = enqueue(q, T0, model="m", vram_gb=20, priority="P2")
    after = reads(q)
    # hget: the task's learned run time (enqueue.lua), read whatever idles
    assert {k: after[k] - before[k] for k in after} == {"hget": 1, "hmget": 1}
    # none serves P2: the task is offered to nobody and every lane stays idle
    assert q.redis.hget(q.keys.task(tid), "offered") is None
    assert q.redis.zcard(q.keys.idle) == 8


def test_a_batch_task_reads_few_idle_lanes_once(real_queue: Queue) -> None:
    """At most 8 idle workers: a P2 enqueue reads those with room and their lanes once; none
    serves P2, so it asks no holders set (before: a ZINTER of idle and the model's holders,
    then the tightest fit's read of the same idle workers)."""
    q = real_queue
    for i in range(8):
        register_worker(q, f"lane-{i}", idle=True, levels="0", holds=("m",) if i % 2 else ())
    stats = q.redis.info("commandstats")
    names = ("zinter", "zrangebyscore", "smismember")
    before = {c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in names}
    tid = enqueue(q, T0, model="m", vram_gb=20, priority="P2")
    stats = q.redis.info("commandstats")
    after = {c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in names}
    assert {k: after[k] - before[k] for k in after} == {"zinter": 0, "zrangebyscore": 1, "smismember": 0}
    assert q.redis.hget(q.keys.task(tid), "offered") is None
    assert q.redis.zcard(q.keys.idle) == 8


def test_idle_lanes_holding_the_model_are_not_read_for_batch_work(real_queue: Queue) -> None:
    """Regression (scripts/bench_scale.py: enqueue 201 µs at 2,048 workers and 10 models
    against 55 at 8): idle online lanes holding a batch task's model came back from the
    idle holders' ZINTER for every enqueue, their lanes read to pass them over. The ZINTER
    now keeps only workers serving the task's level: nine idle lanes holding the model cost
    the one HMGET of the tightest idle fit, and the idle worker that serves P2 gets it."""
    q = real_queue
    for i in range(9):  # more than few_idle's 8: the general path
        register_worker(q, f"lane-{i}", device_gb=40, idle=True, levels="0", holds=("m",))
    before = reads(q)
    lone = enqueue(q, T0, model="m", vram_gb=20, priority="P2")
    after = reads(q)
    assert {k: after[k] - before[k] for k in after} == {"hget": 1, "hmget": 1}
    assert q.redis.hget(q.keys.task(lone), "offered") is None
    register_worker(q, "batch", device_gb=80, idle=True, holds=("m",))
    held = enqueue(q, T0 + 1, model="m", vram_gb=20, priority="P2")
    assert q.redis.hget(q.keys.task(held), "offered") == "batch"


def test_few_idle_workers_offer_to_the_holder_that_serves_the_level(queue: Queue) -> None:
    """With few idle workers the wake rule decides as with many: the tightest idle holder
    that serves the task's level (a lane holding the model is passed over), else the
    tightest idle worker that serves it."""
    register_worker(queue, "lane", device_gb=40, idle=True, levels="0", holds=("m",))
    register_worker(queue, "roomy", device_gb=80, idle=True, holds=("m",))
    register_worker(queue, "tight", device_gb=32, idle=True)
    held = enqueue(queue, T0, model="m", vram_gb=20, priority="P2")
    assert queue.redis.hget(queue.keys.task(held), "offered") == "roomy"
    cold = enqueue(queue, T0 + 1, model="other", vram_gb=20, priority="P2")
    assert queue.redis.hget(queue.keys.task(cold), "offered") == "tight"


def commands(q: Queue) -> dict[str, int]:
    """Calls per command the server counted, the scripts' own and INFO left out."""
    stats = q.redis.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()
            if k not in ("cmdstat_info", "cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval")}


def test_a_claim_weighing_busy_holders_costs_the_same_however_many_there_are(
        make_real_queue: MakeQueue) -> None:
    """Bounded work: a claim that leaves a P2 task for its model's busy holders sends the same
    commands with 40 holders as with 4 (the busy ones in one read, their capacities in one,
    then their tasks until one frees up soon enough: here the first), not a few reads a
    holder; with fewer than 16 busy ones out of `idle`, one more read (a ZINTER) looks for
    holders in `idle` whose free slots lack the room."""
    q = make_real_queue(defer_s=2.0, holder_wait_s=120.0)
    enqueue(q, T0, model="A", vram_gb=30, priority="P2")
    sent = []
    for count, cold in ((4, "cold-a"), (40, "cold-b")):
        for i in range(len(sent) and 4, count):
            register_worker(q, f"h{i:02d}", holds=("A",))
            q.redis.hset(q.keys.task(f"running-on-h{i:02d}"), mapping={"started_at": T0, "est_s": 10})
        before = commands(q)
        r = claim_reply(q, cold, 75 - len(sent), now_ms=T0 + 3000)  # another shape: its own lookout
        after = commands(q)
        assert r.task is None and r.retry_s > 100
        sent.append({k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)})
    assert sent[0].pop("zinter") == 1 and sent[0] == sent[1]
    assert sum(sent[1].values()) <= 20


def test_online_work_reaches_the_idle_worker_that_serves_it_past_many_batch_lanes(
        real_queue: Queue) -> None:
    """Regression: the tightest-fit read looks at the 8 tightest idle workers; with nine idle
    batch lanes tighter than the one idle worker that serves P0, a P0 task was offered to
    nobody and left to the pool's wake list, which a batch lane may pop and find nothing in:
    the task then waited for the serving worker's idle timeout (5 s against a 200 ms SLA).
    Online work now reads the idle workers serving its level when the tightest ones do not."""
    q = real_queue
    for i in range(9):
        register_worker(q, f"batch-{i}", device_gb=24, idle=True, levels="23")
    register_worker(q, "online", device_gb=80, idle=True)
    tid = enqueue(q, T0, model="m", vram_gb=10, priority="P0")
    assert q.redis.hget(q.keys.task(tid), "offered") == "online"
    assert q.redis.lrange(q.keys.wake("online"), 0, -1) == ["1"]
    # batch work behind the same lanes still takes one read of the tightest: a lane serving
    # P2 is among them
    batch = enqueue(q, T0 + 1, model="m", vram_gb=10, priority="P2")
    assert q.redis.hget(q.keys.task(batch), "offered") == "batch-0"


def test_a_claim_too_small_for_online_work_wakes_the_worker_that_serves_it(real_queue: Queue) -> None:
    """The same read from a claim (claim.lua, where a level is a number): a worker too small
    for the P0 task at its queue's head wakes the tightest idle worker that fits and serves
    P0, past nine idle batch lanes that fit it more tightly."""
    q = real_queue
    tid = enqueue(q, T0, model="m", vram_gb=30, priority="P0")  # nobody idles: no offer
    for i in range(9):
        register_worker(q, f"batch-{i}", device_gb=48, idle=True, levels="23")
    register_worker(q, "online", device_gb=80, idle=True)
    register_worker(q, "tiny", device_gb=16)
    assert claim_reply(q, "tiny", free_gb=11, now_ms=T0 + 1).task is None
    assert q.redis.lrange(q.keys.wake("online"), 0, -1) == ["1"]
    assert q.redis.hget(q.keys.task(tid), "state") == "queued"
