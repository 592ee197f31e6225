"""Property-based tests of the scheduler's invariants (hypothesis), under a virtual clock.

Random sequences of enqueue, claim (by one of three workers of different sizes, each keeping
a local VRAM ledger as a real worker does), ack, fail, heartbeat, kill (stop heartbeating,
then reap far in the future), reap, lease expiry while workers keep working (and another
re-claims), cancel, clock ticks and acks by killed workers' stale leases. A model of the
documented state machine (docs/PROTOCOL.md §3) predicts each reply; after every step the
stored state must match it and these must hold:

- a running task has exactly one owner and token: in the running set once, in exactly one
  worker's task set, and in that worker's ledger under the same token;
- no claim overcommits VRAM: the claimed need fits what the worker offered (free + evictable
  for a cold model; need minus footprint within free plus the other idle models for a held
  one, which the worker evicts for it) and the worker's ledger never goes negative;
- every task is in exactly one place: its queue, the delayed set, the running set, or a
  terminal state; each queue index scores its queue's head;
- at the end, after reaping and acking everything claimable, every task is terminal, and each
  succeeded task's result was written once, by the one ack that was not stale.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from helpers import T0, ack, claim, enqueue, fail, reap
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gpuq import Config, Queue, work_index
from gpuq.errors import StaleLease, TaskAlreadyFinished
from gpuq.scripts import ReapResult

LEASE = 30_000
FOOTPRINT = {"A": 8.0, "B": 16.0, "C": 30.0}  # model weights, GB
CAPACITY = (19.0, 43.0, 75.0)  # usable GB of a 24, 48 and 80 GB GPU after the 5 GB reserve
TERMINAL = {"succeeded", "failed", "expired", "canceled"}
MAX_TASKS = 18  # below claim's promotion bound (20 due retries per call)


@dataclass
class Lease:
    token: int
    model: str
    extra: float  # working memory beyond the model's weights


@dataclass
class Worker:
    name: str
    capacity: float
    slots: int = 2
    loaded: dict[str, float] = field(default_factory=dict)  # model -> footprint, LRU first
    running: dict[str, Lease] = field(default_factory=dict)

    def free(self) -> float:
        return (self.capacity - sum(self.loaded.values())
                - sum(lease.extra for lease in self.running.values()))

    def evictable(self) -> float:
        busy = {lease.model for lease in self.running.values()}
        return sum(fp for m, fp in self.loaded.items() if m not in busy)


@dataclass
class Expect:
    """The model's view of one task."""

    priority: int
    model: str
    max_attempts: int
    state: str = "queued"
    attempt: int = 0
    owner: tuple[str, int] | None = None
    lease_exp: int = 0
    ready_at: int = 0
    acks: int = 0
    result: str | None = None


class Sim:
    def __init__(self, queue: Queue) -> None:
        self.q = queue
        self.now = T0
        self.tasks: dict[str, Expect] = {}
        self.workers = [Worker(f"w{i}", cap) for i, cap in enumerate(CAPACITY)]
        self.names = {w.name for w in self.workers}
        self.alive_until: dict[str, int] = {}  # workers that heartbeated: liveness expiry
        self.zombies: list[tuple[str, int]] = []  # leases of killed workers
        self.last_token = 0
        self.kills = 0

    # --- operations -------------------------------------------------------------------
    def op_enqueue(self, priority: int, model: str, extra: int, max_attempts: int) -> None:
        if len(self.tasks) >= MAX_TASKS:
            return
        tid = enqueue(self.q, self.now, model=model, vram_gb=FOOTPRINT[model] + extra,
                      priority=priority, max_attempts=max_attempts,
                      task_id=f"t{len(self.tasks):02d}")  # deterministic: ops pick by order
        self.tasks[tid] = Expect(priority, model, max_attempts)

    def promote_due(self) -> int:
        due = [t for t in self.tasks.values() if t.state == "delayed" and t.ready_at <= self.now]
        for t in due:
            t.state = "queued"
        return len(due)

    def op_claim(self, i: int, wait_ms: int = 0) -> str | None:
        """Claim by worker i, after waiting (e.g. past the defer bound of offered tasks)."""
        self.now += wait_ms
        w = self.workers[i]
        slots = w.slots - len(w.running)
        if slots < 1:
            return None
        free, evictable = w.free(), w.evictable()
        self.promote_due()
        c = claim(self.q, w.name, free, evictable, slots, list(w.loaded.items()),
                  now_ms=self.now)
        if c is None:
            return None
        tid, model, need, token = c["id"], c["model"], float(c["vram_gb"]), int(c["token"])
        t = self.tasks[tid]
        assert t.state == "queued", f"claimed a task the model has {t.state}"
        assert token > self.last_token, "fencing tokens must only grow"
        self.last_token = token
        if model in w.loaded:
            # the worker's other idle models make room for a held model's task (claim.lua's
            # held_room; ModelCache.reserve evicts them, least recently used first)
            extra = max(0.0, need - w.loaded[model])
            room = free + max(0.0, evictable - w.loaded[model])
            assert extra <= room, f"held {model}: {extra} GB extra offered {free} free + {room - free} idle"
            busy = {lease.model for lease in w.running.values()}
            for old in list(w.loaded):
                if w.free() >= extra:
                    break
                if old != model and old not in busy:
                    del w.loaded[old]
        else:
            assert need <= free + evictable, f"cold {need} GB > {free} free + {evictable}"
            busy = {lease.model for lease in w.running.values()}
            for old in list(w.loaded):  # evict idle models, least recently used first
                if w.free() >= need:
                    break
                if old not in busy:
                    del w.loaded[old]
            w.loaded[model] = FOOTPRINT[model]
            extra = need - FOOTPRINT[model]
        w.running[tid] = Lease(token, model, extra)
        assert w.free() >= -1e-9, "the worker's ledger went negative"
        t.state, t.owner, t.lease_exp = "running", (w.name, token), self.now + LEASE
        t.attempt += 1
        assert int(c["attempt"]) == t.attempt
        return tid

    def _pick(self, i: int, k: int) -> tuple[Worker, str, Lease, bool] | None:
        w = self.workers[i]
        if not w.running:
            return None
        tid = sorted(w.running)[k % len(w.running)]
        lease = w.running.pop(tid)
        t = self.tasks[tid]
        return w, tid, lease, t.state == "running" and t.owner == (w.name, lease.token)

    def op_ack(self, i: int, k: int) -> None:
        picked = self._pick(i, k)
        if picked is None:
            return
        w, tid, lease, live = picked
        result = f"{tid}@{lease.token}"
        if not live:
            with pytest.raises(StaleLease):
                ack(self.q, tid, lease.token, result, now_ms=self.now)
            return
        ack(self.q, tid, lease.token, result, now_ms=self.now)
        t = self.tasks[tid]
        t.state, t.owner, t.result = "succeeded", None, result
        t.acks += 1

    def op_fail(self, i: int, k: int, retry: bool) -> None:
        picked = self._pick(i, k)
        if picked is None:
            return
        w, tid, lease, live = picked
        if not live:
            with pytest.raises(StaleLease):
                fail(self.q, tid, lease.token, "err", retry=retry, now_ms=self.now)
            return
        t = self.tasks[tid]
        expected = "delayed" if retry and t.attempt < t.max_attempts else "failed"
        assert fail(self.q, tid, lease.token, "err", retry=retry, now_ms=self.now) == expected
        t.state, t.owner = expected, None
        t.ready_at = self.now + min(1000 * 2 ** (t.attempt - 1), 300_000)

    def op_heartbeat(self, i: int) -> None:
        w = self.workers[i]
        leases = [(tid, lease.token) for tid, lease in w.running.items()]
        revived, lost = self.q.scripts.run(self.q.calls.heartbeat(w.name, leases,
                                                                  now_ms=self.now))
        assert revived == (w.name not in self.alive_until)  # new, or reaped as dead
        expected = [tid for tid, tok in leases
                    if not (self.tasks[tid].state == "running"
                            and self.tasks[tid].owner == (w.name, tok))]
        assert lost == expected
        for tid in lost:
            del w.running[tid]
        for tid in w.running:
            self.tasks[tid].lease_exp = self.now + LEASE
        self.alive_until[w.name] = self.now + LEASE

    def op_kill(self, i: int) -> None:
        dead = self.workers[i]
        self.zombies += [(tid, lease.token) for tid, lease in dead.running.items()]
        self.kills += 1
        self.workers[i] = Worker(f"w{i}-{self.kills}", dead.capacity)
        self.names.add(self.workers[i].name)
        self.now += LEASE + 1
        for j in range(len(self.workers)):
            if j != i:
                self.op_heartbeat(j)
        self.op_reap()

    def _recover(self, t: Expect) -> str:
        t.owner = None
        t.state = "failed" if t.attempt >= t.max_attempts else "queued"
        return t.state

    def op_reap(self) -> None:
        got = reap(self.q, now_ms=self.now)
        outcomes = []
        dead = sorted(w for w, until in self.alive_until.items() if until <= self.now)
        for w in dead:
            del self.alive_until[w]
            for t in self.tasks.values():
                if t.state == "running" and t.owner and t.owner[0] == w:
                    outcomes.append(self._recover(t))
        for t in self.tasks.values():
            if t.state == "running" and t.lease_exp <= self.now:
                outcomes.append(self._recover(t))
        promoted = self.promote_due()
        assert got == ReapResult(outcomes.count("queued"), outcomes.count("failed"), len(dead),
                                 promoted)

    def op_steal(self, i: int, j: int, then: str) -> None:
        """Leases run out while worker i works on; worker j re-claims a task of i's; then i
        acks it, fails it or heartbeats: all must see the lease as lost."""
        self.op_expire()
        tid = self.op_claim(j, 2_001)
        w = self.workers[i]
        if i == j or tid is None or tid not in w.running:
            return
        k = sorted(w.running).index(tid)
        {"ack": lambda: self.op_ack(i, k), "fail": lambda: self.op_fail(i, k, True),
         "heartbeat": lambda: self.op_heartbeat(i)}[then]()

    def op_cancel(self, k: int) -> None:
        if not self.tasks:
            return
        tid = sorted(self.tasks)[k % len(self.tasks)]
        t = self.tasks[tid]
        if t.state in TERMINAL:
            with pytest.raises(TaskAlreadyFinished):
                self.q.scripts.run(self.q.calls.cancel(tid, now_ms=self.now))
            return
        assert self.q.scripts.run(self.q.calls.cancel(tid, now_ms=self.now)) == t.state
        t.state, t.owner = "canceled", None

    def op_zombie_ack(self, k: int) -> None:
        if not self.zombies:
            return
        tid, token = self.zombies[k % len(self.zombies)]
        t = self.tasks[tid]
        assert not (t.state == "running" and t.owner and t.owner[1] == token)
        with pytest.raises(StaleLease):
            ack(self.q, tid, token, "zombie", now_ms=self.now)

    def op_tick(self, ms: int) -> None:
        self.now += ms

    def op_expire(self) -> None:
        """Every lease runs out while workers keep working: their acks must be stale."""
        self.now += LEASE + 1
        self.op_reap()

    # --- invariants ---------------------------------------------------------------------
    def check(self) -> None:
        r, k = self.q.redis, self.q.keys
        ids = sorted(self.tasks)
        names = sorted(self.names | {"drain"})
        pipe = r.pipeline(transaction=False)
        for tid in ids:
            pipe.hgetall(k.task(tid))
        pipe.zrange(k.running, 0, -1, withscores=True)
        pipe.zrange(k.delayed, 0, -1, withscores=True)
        cells = [(p, m) for p in range(4) for m in FOOTPRINT]
        for p, m in cells:
            pipe.zrange(k.queue(p, m), 0, -1, withscores=True)
        pipe.zrange(k.models_with_work, 0, -1, withscores=True)
        for name in names:
            pipe.smembers(k.worker_tasks(name))
        pipe.hgetall(k.fairness)
        out = pipe.execute()
        hashes = dict(zip(ids, out[:len(ids)]))
        rest = out[len(ids):]
        running, delayed = dict(rest[0]), dict(rest[1])
        queues = {cell: dict(z) for cell, z in zip(cells, rest[2:2 + len(cells)])}
        index = [{work_index.split(e)[1]: s for e, s in rest[2 + len(cells)]
                  if work_index.split(e)[0] == p} for p in range(4)]
        owned = dict(zip(names, rest[3 + len(cells):]))
        ledgers = {w.name: w for w in self.workers}
        # a claim skips the delayed set until its gate's time: the gate never passes a retry
        # (lib/gates.lua), or the retry would wait past its due time
        if delayed:
            assert float(out[-1]["due_at"]) <= min(delayed.values())

        for p in range(4):  # the index of models with work scores each queue's head
            heads = {m: work_index.score(p, min(queues[(p, m)].values())) for m in FOOTPRINT
                     if queues[(p, m)]}
            assert index[p] == heads
        assert set(running) == set().union(*owned.values())
        for tid, h in hashes.items():
            t = self.tasks[tid]
            assert h["state"] == t.state and int(h.get("attempt", 0)) == t.attempt, tid
            in_queues = [cell for cell, z in queues.items() if tid in z]
            places = len(in_queues) + (tid in delayed) + (tid in running)
            owners = [name for name, tasks in owned.items() if tid in tasks]
            assert places == (0 if t.state in TERMINAL else 1), (tid, t.state)
            if t.state == "queued":
                assert in_queues == [(t.priority, t.model)]
            elif t.state == "delayed":
                assert delayed[tid] == t.ready_at
            elif t.state == "running":
                assert t.owner is not None and running[tid] == t.lease_exp
                assert owners == [t.owner[0]] and (h["worker"], int(h["token"])) == t.owner
                ledger = ledgers.get(t.owner[0])
                assert ledger is not None and ledger.running[tid].token == t.owner[1]
            if t.state != "running":
                assert owners == []

    # --- the end ------------------------------------------------------------------------
    def drain(self) -> None:
        self.workers.append(Worker("drain", 10_000.0, slots=1))
        for _ in range(4 * MAX_TASKS + 10):
            if all(t.state in TERMINAL for t in self.tasks.values()):
                break
            self.now += 400_000  # past every lease, backoff and defer bound
            self.op_reap()
            self.now += 2_001  # tasks the reap requeued: past their defer bound too
            if self.op_claim(len(self.workers) - 1):
                self.op_ack(len(self.workers) - 1, 0)
            self.check()
        for tid, t in self.tasks.items():
            assert t.state in TERMINAL, tid
            assert t.acks == (1 if t.state == "succeeded" else 0)
            record = self.q.record(tid)
            assert record.state.value == t.state
            assert record.result == t.result


worker_ix = st.integers(0, len(CAPACITY) - 1)
ENQUEUE = st.tuples(st.just("enqueue"), st.integers(0, 3), st.sampled_from(sorted(FOOTPRINT)),
                   st.integers(0, 12), st.integers(1, 3))
CLAIM = st.tuples(st.just("claim"), worker_ix, st.sampled_from([0, 0, 2_001]))
OPS = st.lists(st.one_of(
    ENQUEUE, ENQUEUE, ENQUEUE, CLAIM, CLAIM, CLAIM,
    st.tuples(st.just("ack"), worker_ix, st.integers(0, 3)),
    st.tuples(st.just("ack"), worker_ix, st.integers(0, 3)),
    st.tuples(st.just("fail"), worker_ix, st.integers(0, 3), st.booleans()),
    st.tuples(st.just("heartbeat"), worker_ix),
    st.tuples(st.just("kill"), worker_ix),
    st.tuples(st.just("reap")),
    st.tuples(st.just("expire")),
    st.tuples(st.just("steal"), worker_ix, worker_ix, st.sampled_from(["ack", "fail",
                                                                      "heartbeat"])),
    st.tuples(st.just("tick"), st.integers(1, 40_000)),
    st.tuples(st.just("cancel"), st.integers(0, MAX_TASKS)),
    st.tuples(st.just("zombie_ack"), st.integers(0, 10)),
), min_size=15, max_size=60)


def run_ops(queue: Queue, ops: list[tuple[Any, ...]]) -> None:
    sim = Sim(queue)
    for name, *args in ops:
        getattr(sim, f"op_{name}")(*args)
        sim.check()
    sim.drain()


@pytest.mark.parametrize("kind, examples", [("fake", 100), ("real", 50)])
def test_scheduler_invariants(kind: str, examples: int, connect: Callable[[str], redis.Redis],
                              prefix: str) -> None:
    client = connect(kind)

    # no "explain" phase: its line tracing makes shrinking a failure many times slower
    @settings(max_examples=examples, deadline=None, database=None,
              phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
              suppress_health_check=[HealthCheck.too_slow])
    @given(ops=OPS)
    def check(ops: list[tuple[Any, ...]]) -> None:
        pool = f"h{uuid.uuid4().hex[:10]}"  # a fresh pool per example
        run_ops(Queue(client, Config(pool=pool, prefix=prefix)), ops)

    check()
