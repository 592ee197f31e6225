"""The schedulers a simulation can run: gpuq itself, on the real scripts, and two baselines.

- ``gpuq``: every decision goes through the production Lua scripts on a real server (enqueue,
  claim, ack, requeue for yields) with ``now`` from the virtual clock; the reaper's duties
  (recovery, deadline expiry, preemption planning) run on it every ``reap_interval_s``.
- ``fifo``: one FIFO queue; no priorities, no model affinity; the head goes to the first idle
  GPU that can hold it, and waits (blocking the rest) while none can.
- ``priority``: one FIFO queue per priority, strict order, head of the highest non-empty
  queue only; no affinity, no best fit, no preemption.

Both baselines ignore lanes (``--gpus 2x80/01``: a gpuq feature) and keep models resident
on their GPUs the way an inference server would (LRU), so the load counts compare
placement, not caching.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from gpuq import catalog, worker_record
from gpuq.config import Config
from gpuq.reaper.loop import Reaper
from gpuq.scripts import ClaimRequest
from gpuq.sim.model import TraceTask
from gpuq.task import TaskSpec
from gpuq.wire import exchange
from gpuq.worker.gpu import GpuInfo, class_name
from gpuq.worker.presence import Presence

POLICIES = ("gpuq", "fifo", "priority")


Joining = tuple[str, float, str, int]  # a GPU joining: id, total GB, levels served, devices


@dataclass(frozen=True)
class Offer:
    """A claimed task: its id, fencing token (0 for baselines) and resume point."""

    task_id: str
    token: int
    done_s: float  # work already done by an earlier, preempted run
    cold: bool = False  # gpuq's claim started it cold: the worker reports its handler's start


class Scheduler(Protocol):
    name: str

    # GPUs join: (id, total GB, levels served, devices) each, registered as a worker does
    def register(self, gpus: Sequence[Joining], now_ms: int) -> None: ...
    # whether the enqueue woke the reaper (online work no idle worker was woken for)
    def submit(self, task_id: str, task: TraceTask, now_ms: int) -> bool: ...
    # finished: the task the worker ends before this claim (acked in the same round trip)
    def claim(self, worker_id: str, req: ClaimRequest, now_ms: int,
              finished: Offer | None = None) -> Offer | float: ...
    # the idle workers woken, in claim order: each with whether it was woken as its shape's
    # lookout (gpuq: lib/lookout.lua). n_idle: how many idle; idle: their ids, in order
    def woken(self, n_idle: int, idle: Callable[[], list[str]]) -> dict[str, bool]: ...


class GpuqScheduler:
    """The real scripts on a real server; the virtual clock is every call's ``now``."""

    name = "gpuq"

    def __init__(self, client: redis.Redis, config: Config) -> None:
        self.redis = client
        self.config = config
        self.reaper = Reaper(client, config)  # its duties run on the virtual clock (tick)
        self.keys, self.scripts, self.calls = self.reaper.keys, self.reaper.scripts, self.reaper.calls
        # `idle`'s size and the pool-wide tokens, read with the last claim or enqueue (and the
        # worker an enqueue offered its task to); every other call that writes (this class's
        # methods, and the scale step, always followed by `control`) drops them, and `woken`
        # reads them again
        self.counts: list[Any] | None = None
        self._count = [("ZCARD", self.keys.idle), ("LLEN", self.keys.pool_wake)]
        # the woken workers' tokens, popped with the next claim's round trip (the woken
        # worker's own: a claim reads neither wake list)
        self.drain: list[tuple[Any, ...]] = []

    def _stale(self) -> None:
        """A call that writes without the counts: they are read again; tokens are popped."""
        if self.drain:
            exchange(self.redis, self.drain, retry=True)
            self.drain = []
        self.counts = None

    def _with_drain(self, extra: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        out, self.drain = [*self.drain, *extra], []
        return out

    def register(self, gpus: Sequence[Joining], now_ms: int) -> None:
        """Each GPU registers and beats once, as a worker process starts: all in two round
        trips (the registrations' writes, then the beats), not three per GPU."""
        self._stale()
        lease_ms = int(self.config.lease_s * 1000)
        pipe = self.redis.pipeline(transaction=False)
        for worker_id, total_gb, levels, devices in gpus:
            name = class_name(f"sim-{total_gb / devices:g}GB", devices)
            gpu = GpuInfo(name, "", total_gb, None, "declared", devices)
            fields = worker_record.identity(worker_id, gpu, self.config.kv_reserve_gb, 1, levels, "sim", 0)
            Presence(self.redis, self.keys, worker_id).add_registration(pipe, fields, lease_ms, now_ms)
        pipe.execute()
        beats = [self.calls.heartbeat(g[0], [], now_ms=now_ms) for g in gpus]
        for beat, reply in zip(beats, self.scripts.pipelined(beats)):
            beat.parse(reply)

    def submit(self, task_id: str, task: TraceTask, now_ms: int) -> bool:
        """Enqueue, and pop the urgent token as the active reaper would: one round trip."""
        spec = TaskSpec.build("sim.run", None, model=task.model, vram_gb=task.vram_gb,
                              priority=task.priority, est_s=task.est_s, deadline_s=task.deadline_s,
                              preemptible=task.preemptible, tenant=task.tenant, task_id=task_id,
                              gpus=task.gpus)
        call = self.calls.enqueue([spec], now_ms=now_ms)
        extra = [("LPOP", self.keys.urgent), *self._count, ("HGET", self.keys.task(task_id), "offered")]
        reply, *rest = self.scripts.pipelined([call], self._with_drain(extra))
        token, self.counts = rest[-4], rest[-3:]
        call.parse(reply)
        return bool(token == "1")  # "due": a delayed task became first due (a replay keeps time)

    def claim(self, worker_id: str, req: ClaimRequest, now_ms: int,
              finished: Offer | None = None) -> Offer | float:
        """As a real worker: the ack of the task it ends, then its claim, in one round trip."""
        call = self.calls.claim(req, now_ms=now_ms)
        if finished is None:
            reply, *rest = self.scripts.pipelined([call], self._with_drain(self._count))
        else:
            ack = self.calls.ack(finished.task_id, finished.token, "null", now_ms=now_ms)
            acked, reply, *rest = self.scripts.pipelined([ack, call], self._with_drain(self._count))
            ack.parse(acked)
        self.counts = rest[-2:]
        got = call.parse(reply)
        if got.task is None:
            return got.retry_s
        checkpoint = json.loads(got.task.get("checkpoint") or "{}")
        return Offer(got.task["id"], int(got.task["token"]), float(checkpoint.get("done_s", 0.0)),
                     got.task.get("sla") == "pending")

    def began(self, offer: Offer, now_ms: int) -> None:
        """A cold-started task's handler starts (its load is over), as the worker reports it."""
        self._stale()
        self.scripts.run(self.calls.began(offer.task_id, offer.token, now_ms=now_ms))

    def recorded(self, load: tuple[str, float, float]) -> None:
        """A load ended: (model, footprint, seconds) into the catalog, as the worker records it
        once loaded (gpuq.worker.loading)."""
        self._stale()
        pipe = self.redis.pipeline(transaction=False)
        catalog.record_load(pipe, self.keys, *load)
        pipe.execute()

    def yield_task(self, offer: Offer, done_s: float, now_ms: int) -> str:
        """The task back to its queue, its progress kept; "queued", or "expired" where its
        deadline can no longer be met (requeue.lua)."""
        self._stale()
        return self.scripts.run(self.calls.requeue(
            offer.task_id, offer.token, "yielded", preempted="yielded",
            checkpoint=f'{{"done_s":{done_s:.6f}}}', now_ms=now_ms))

    def stop_task(self, offer: Offer, now_ms: int) -> str:
        """The worker's stop of a task past its yield grace (gpuq.worker.control); as
        ``yield_task``."""
        self._stale()
        return self.scripts.run(self.calls.requeue(
            offer.task_id, offer.token, "stopped: did not yield in time", preempted="stopped", now_ms=now_ms))

    def expired_by_level(self) -> list[int]:
        """Tasks ended expired so far, per priority (stats ``expired:P<n>``)."""
        return [int(n or 0) for n in self.redis.hmget(self.keys.stats, [f"expired:P{p}" for p in range(4)])]

    def asked_to_yield(self, task_id: str) -> bool:
        """Whether a yield request for the task still stands (withdraw_yield clears it)."""
        return bool(self.redis.hget(self.keys.task(task_id), "yield_for"))

    def hold(self, worker_id: str, dropped: list[str], held: str = "") -> None:
        """Tell the pool a worker dropped models and holds one (affinity and expiry read
        it): a task's model from its load's start, a preload's once loaded, as a worker's
        (gpuq.worker.loading)."""
        self._stale()
        presence = Presence(self.redis, self.keys, worker_id)
        pipe = presence.pipeline()
        for old in dropped:
            presence.hold(pipe, old, False)
        if held:
            presence.hold(pipe, held, True)
        pipe.execute()

    def leave(self, worker_id: str, models: list[str]) -> None:
        """A worker leaves the pool (an autoscaled replay's idle GPU retiring)."""
        self._stale()
        Presence(self.redis, self.keys, worker_id).leave(models)

    def woken(self, n_idle: int, ids: Callable[[], list[str]]) -> dict[str, bool]:
        """The idle workers a wake token reaches, as blocked real workers would pop them: a
        worker's own token first, then pool-wide tokens to the others in order; with whether
        an own token was "look" (lib/lookout.lua).

        A worker's own token is pushed only with its removal from ``idle`` (the wake rule's
        wake_worker; simulated workers take no hand-overs), and the worker rejoins ``idle``
        only by claiming: so the GPUs the engine holds idle that ``idle`` no longer lists are
        the ones holding a token. One read of ``idle`` finds them, however large the pool;
        their tokens are then dropped (popped, as the worker would)."""
        if not n_idle:
            return {}
        # `idle` lists only GPUs the engine holds idle (one slot each), so with as many listed
        # as held idle and no pool-wide token nobody was woken: two counts, not the whole set
        listed_n, pooled, *offered = self.counts or exchange(self.redis, self._count, retry=True)
        self.counts = None
        if listed_n == n_idle and not pooled:
            return {}
        idle = ids()
        own: list[str] = []
        rest = idle
        looks: dict[str, bool] = {}
        if listed_n == len(idle) - 1 and offered and offered[0] in idle:
            # after an enqueue, which wakes only the worker it offers its task to ("1")
            own, rest = offered, [w for w in idle if w != offered[0]]
        elif listed_n != len(idle):
            still = set(exchange(self.redis, [("ZRANGE", self.keys.idle, 0, -1)], retry=True)[0])
            own = [w for w in idle if w not in still]
            rest = [w for w in idle if w in still]
            tokens = exchange(self.redis, [("LRANGE", self.keys.wake(w), 0, -1) for w in own], retry=True)
            looks = {w: "look" in got for w, got in zip(own, tokens)}
        shared = min(pooled, len(rest))
        # the tokens are popped in the first woken worker's claim's round trip
        self.drain = [("DEL", self.keys.wake(w)) for w in own]
        if shared:
            self.drain.append(("LPOP", self.keys.pool_wake, shared))
        chosen = set(rest[:shared]) | set(own)
        return {w: looks.get(w, False) for w in idle if w in chosen}

    def plan(self, now_ms: int) -> dict[str, int]:
        """The reaper's preemption pass on an urgent wake."""
        self._stale()
        return self.reaper.preemptor.step(now_ms)

    def control(self, workers: list[str]) -> dict[str, list[str]]:
        """Each worker's control messages, oldest first (what its heartbeat thread would pop)."""
        self._stale()
        pipe = self.redis.pipeline(transaction=False)
        for w in workers:
            pipe.lrange(self.keys.control(w), 0, -1)
            pipe.delete(self.keys.control(w))
        replies = pipe.execute()[0::2]
        return {w: [str(m) for m in msgs][::-1] for w, msgs in zip(workers, replies) if msgs}

    def tick(self, now_ms: int, horizon_ms: int, *, deadlines: bool, urgent: bool,
             tenants: bool = False) -> dict[str, int]:
        """The reaper's round at a virtual time: expiry while tasks with deadlines wait,
        preemption planning while urgent ones do, tenants' room while they are registered
        (its wake-ups go through the pool's list, as the script posts them). (Recovery has
        nothing to do: simulated workers never die, so it is not called.)"""
        self._stale()
        expired = self.reaper.expire(now_ms, horizon_ms) if deadlines else 0
        if tenants:
            self.reaper.room.step(now_ms)
        return {"expired": expired, **(self.reaper.preemptor.step(now_ms) if urgent else {})}

    def quiet_until(self, horizon_ms: int, *, deadlines: bool, urgent: bool) -> int | None:
        """After a round that decided nothing (its arguments as ``tick``'s): the first time
        (ms) at which one could decide something, the pool unchanged; None: not before it
        changes. Expiry looks only at tasks whose latest start (the deadline index's score)
        is within the horizon, so none expires before the index's first score minus the
        horizon (entries of tasks no longer queued included: they only make it earlier);
        the planner says its own."""
        times = []
        if deadlines:
            first = self.redis.zrange(self.keys.deadlines, 0, 0, withscores=True)
            if first:
                times.append(int(first[0][1]) - horizon_ms)
        if urgent and self.reaper.preemptor.quiet_until is not None:
            times.append(self.reaper.preemptor.quiet_until)
        return min(times, default=None)


class QueueScheduler:
    """The baselines: plain queues in memory, head of line only."""

    def __init__(self, name: str, tasks: dict[str, TraceTask]) -> None:
        self.name = name
        self.tasks = tasks
        self.queues: list[deque[str]] = [deque() for _ in range(4 if name == "priority" else 1)]

    def register(self, gpus: Sequence[Joining], now_ms: int) -> None:
        pass

    def submit(self, task_id: str, task: TraceTask, now_ms: int) -> bool:
        self.queues[task.priority if self.name == "priority" else 0].append(task_id)
        return False  # no reaper, no preemption

    def claim(self, worker_id: str, req: ClaimRequest, now_ms: int,
              finished: Offer | None = None) -> Offer | float:
        # lanes are gpuq's: a baseline GPU takes whatever head is next
        queue = next((q for q in self.queues if q), None)
        if queue is None:
            return 0.0
        head = self.tasks[queue[0]]
        if not req.fits(head.model, head.vram_gb, head.gpus):
            return 0.0  # head-of-line: nothing behind it goes first
        return Offer(queue.popleft(), 0, 0.0)

    def woken(self, n_idle: int, idle: Callable[[], list[str]]) -> dict[str, bool]:
        return dict.fromkeys(idle(), False) if n_idle and any(self.queues) else {}
