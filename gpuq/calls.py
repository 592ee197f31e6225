"""One typed call builder per Lua script: ``Calls`` makes a ``Call`` per verb (the script's
name, its arguments as the script reads them, the parser of its reply); ``gpuq.scripts``
runs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuq.call import Call, Replicas
from gpuq.claims import Batch, Claim, ClaimRequest
from gpuq.config import Config
from gpuq.errors import InvalidTask, NotRequeueable, TenantError
from gpuq.replies import Code, checked, raise_for
from gpuq.task import TaskSpec, deferral_args

MAX_ERROR = 2000  # characters of a task's error (a failure's, or a requeue's reason) kept
LEARN_MAX_RUNS = 256  # learn.lua's limit per call


@dataclass(frozen=True)
class ReapResult:
    requeued: int
    failed: int
    dead_workers: int
    promoted: int
    # (worker, task, state) per task recovered (worker "": its lease expired), (worker, "",
    # "") per dead worker that ran none: for the reaper's log, not compared
    recovered: tuple[tuple[str, str, str], ...] = field(default=(), compare=False)

    def __add__(self, other: ReapResult) -> ReapResult:
        return ReapResult(self.requeued + other.requeued, self.failed + other.failed,
                          self.dead_workers + other.dead_workers, self.promoted + other.promoted,
                          self.recovered + other.recovered)


def _reaped(r: list[Any]) -> ReapResult:
    checked(r)
    named = tuple((str(e[0]), str(e[1]), str(e[2])) if len(e) == 3 else (str(e[0]), "", "")
                  for e in (r[5] if len(r) > 5 else ()))
    return ReapResult(int(r[1]), int(r[2]), int(r[3]), int(r[4]), named)


def num_text(x: float) -> str:
    """A number as the scripts are sent it: a whole one without its ".0"."""
    return repr(float(x)) if x != int(x) else str(int(x))


class Calls:
    """Builds the call of each verb for one pool and config; ``now_ms=0`` = server clock."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._ttl = str(int(config.result_ttl_s * 1000))
        # arguments fixed by the (frozen) config, formatted once rather than on every call
        self._sla = " ".join(str(ms) for ms in config.sla_ms())  # enqueue's, one text
        self._claim_tail = [str(int(config.lease_s * 1000)), str(config.fair_every)]
        self._scan = str(config.scan_per_queue)
        # claim's in one text (claim.lua); P0 and P1 never wait for a busy holder
        self._claim_settings = " ".join([*self._claim_tail, self._scan, *map(str, config.defer_ms()),
                                         *map(str, config.holder_wait_ms()[2:])])

    def _replicas(self, strict: bool, what: str, task_id: str = "") -> Replicas | None:
        c = self.config  # a task's call is named (a format) only where replicas are asked
        return None if not c.replica_acks else Replicas(
            c.replica_acks, c.replica_wait_ms, strict, f"{what} of task {task_id}" if task_id else what)

    def enqueue(self, specs: Sequence[TaskSpec], *, check_fit: bool = False,
                now_ms: int = 0, first: int | None = None) -> Call[int]:
        """first: the place of ``specs[0]`` in its bulk (enqueue_many), so that a refusal
        names the task's place; None: a lone enqueue's call."""
        args = [str(now_ms), "1" if check_fit else "0", self._sla]
        for s in specs:
            deadline = "" if s.deadline_s is None else str(max(1, int(s.deadline_s * 1000)))
            est = "" if s.est_s is None else num_text(s.est_s)  # "": the learned estimate, else 1
            args += [s.task_id, s.handler, s.payload, s.model, num_text(s.vram_gb), str(int(s.priority)),
                     est, deadline, "1" if s.preemptible else "0", s.tenant,
                     str(s.max_attempts), "1" if s.report_end else "0", str(s.gpus),
                     *deferral_args(s)]

        def parse(reply: list[Any]) -> int:
            if int(reply[0]) != Code.OK and len(reply) > 1 and int(reply[1]) > 0:
                i = int(reply[1]) - 1
                raise_for(reply, specs[i].task_id, index=None if first is None else first + i)
            raise_for(reply)
            return int(reply[1])

        what = f"task {specs[0].task_id}" if len(specs) == 1 else f"a call of {len(specs)} tasks"
        return Call("enqueue", args, parse, self._replicas(True, what))

    def claim(self, req: ClaimRequest, *, now_ms: int = 0) -> Call[Claim]:
        args = [req.worker_id, str(now_ms), num_text(req.free_gb), num_text(req.evictable_gb), str(req.slots),
                self._claim_settings, req.levels, str(req.gpus),
                "1" if req.lookout else "2" if req.unlisted else "0", str(len(req.batches))]
        for handler, more in req.batches:
            args += [handler, str(more)]
        for model, footprint in req.loaded:  # negative: a running task uses it; "~": loading
            args += [model, ("~" if model in req.loading else "") + ("-" if model in req.in_use else "")
                     + num_text(footprint)]
        for model, left_ms in req.skipped:
            args += [model, f"skip:{left_ms}"]
        return Call("claim", args, Claim.parse)

    def claim_batch(self, worker_id: str, first: dict[str, str], free_gb: float,
                    footprint_gb: float, warm: bool, count: int, *, now_ms: int = 0) -> Call[Batch]:
        """Up to ``count`` more tasks for the batch of the claimed task ``first`` (its fields)."""
        args = [worker_id, str(now_ms), num_text(free_gb), *self._claim_tail, first["id"], first["token"],
                num_text(footprint_gb), "1" if warm else "0", str(count),
                str(max(int(self._scan), 4 * count))]
        return Call("claim_batch", args, lambda r: Batch.parse(r, first))

    def began(self, task_id: str, token: int, *, now_ms: int = 0,
              warm: bool = False) -> Call[tuple[str, int]]:
        """A handler starts, after a load or (``warm``) none: (SLA "met", "missed" or "", ms)."""
        def parse(r: list[Any]) -> tuple[str, int]:
            raise_for(r, task_id)
            return str(r[1]), int(r[2])

        return Call("began", [task_id, str(token), str(now_ms), "1" if warm else "0"], parse)

    def heartbeat(self, worker_id: str, leases: Sequence[tuple[str, int]], *,
                  now_ms: int = 0) -> Call[tuple[bool, list[str]]]:
        """Renew; the reply says whether the worker was revived and which leases were lost."""
        args = [worker_id, str(now_ms), str(int(self.config.lease_s * 1000))]
        for task_id, token in leases:
            args += [task_id, str(token)]
        return Call("heartbeat", args, lambda r: (int(checked(r)[1]) == 1, [str(x) for x in r[2:]]))

    def ack(self, task_id: str, token: int, result_json: str, *, now_ms: int = 0) -> Call[None]:
        return Call("ack", [task_id, str(token), str(now_ms), result_json, self._ttl],
                    lambda r: raise_for(r, task_id), self._replicas(False, "ack", task_id))

    def wait(self, task_id: str) -> Call[str]:
        """A result waiter registers, just before its pop: the task's state (TaskNotFound
        when there is none); the task's end, or an end already passed, then pushes its done
        list."""
        def parse(r: list[Any]) -> str:
            raise_for(r, task_id)
            return str(r[1])

        return Call("wait", [task_id], parse)

    def learn(self, runs: Sequence[tuple[str, str, float]]) -> Call[int]:
        """Add measured runs, (handler, model, seconds) each, at most LEARN_MAX_RUNS, to
        ``runtimes``; the reply counts those recorded (a new pair past the cap is not)."""
        args: list[str] = []
        for handler, model, seconds in runs:
            args += [handler, model, repr(float(seconds))]
        return Call("learn", args, lambda r: int(checked(r)[1]))

    def tenant(self, op: str, *args: str) -> Call[str]:
        """tenant.lua: "set" name weight max_gpus max_vram_gb ("-": no cap), "remove" name,
        "require" "1"/"0", or the reaper's "bound", "forget" and "slots"; the reply is the
        former value ("" if none)."""
        def parse(r: list[Any]) -> str:
            if int(r[0]) == Code.NOT_FOUND:
                raise TenantError(f"tenant {args[0]!r} is not registered")
            if int(r[0]) != Code.OK:
                raise TenantError(str(r[2]))
            return str(r[1])

        return Call("tenant", [op, *args], parse)

    def fail(self, task_id: str, token: int, error: str, *, retry: bool = True,
             now_ms: int = 0, pass_ms: int | None = None) -> Call[str]:
        """pass_ms: pass the task on instead (another worker runs its handler): its attempt
        is given back and it waits pass_ms; the reply is then "passed"."""
        c = self.config
        mode = "2" if pass_ms is not None else "1" if retry else "0"
        base = pass_ms if pass_ms is not None else int(c.retry_base_s * 1000)
        args = [task_id, str(token), str(now_ms), error.replace("\n", " ")[:MAX_ERROR], mode,
                str(base), str(int(c.retry_max_s * 1000)), self._ttl]

        def parse(r: list[Any]) -> str:
            raise_for(r, task_id)
            return str(r[1])

        return Call("fail", args, parse, self._replicas(False, "fail", task_id))

    def requeue(self, task_id: str, token: int | None, reason: str, *, consume: bool = False,
                preempted: str = "", checkpoint: str = "", now_ms: int = 0) -> Call[str]:
        """preempted: "" or how the task gave way ("yielded", "stopped"); checkpoint: JSON
        text its next run receives ("" keeps the stored one). ``reason`` is kept in the
        task's error field as a failure's error is: one line, at most MAX_ERROR characters."""
        if not isinstance(reason, str):  # an operator's own reason (Queue.requeue)
            raise InvalidTask(f"requeue reason must be a string, got {reason!r}", task_id)
        reason = reason.replace("\n", " ")[:MAX_ERROR]
        args = [task_id, "" if token is None else str(token), str(now_ms), reason,
                "1" if consume else "0", self._ttl, preempted, checkpoint]

        def parse(r: list[Any]) -> str:
            if token is None and int(r[0]) == Code.INVALID:
                raise NotRequeueable(task_id, str(r[2]))
            raise_for(r, task_id)
            return str(r[1])

        return Call("requeue", args, parse, self._replicas(False, "requeue", task_id))

    def cancel(self, task_id: str, *, now_ms: int = 0) -> Call[str]:
        def parse(r: list[Any]) -> str:
            raise_for(r, task_id)
            return str(r[1])

        return Call("cancel", [task_id, str(now_ms), self._ttl], parse)

    def reap(self, *, limit: int = 100, now_ms: int = 0) -> Call[ReapResult]:
        return Call("reap", [str(now_ms), str(limit), self._ttl], _reaped)

    def expire(self, *, limit: int = 100, horizon_ms: int = 0, offset: int = 0,
               now_ms: int = 0) -> Call[tuple[int, int, int]]:
        """(expired, looked at, kept) of one bounded expiry call; offset skips the tasks at
        the front of the window that earlier calls of the same pass kept."""
        return Call("expire", [str(now_ms), str(limit), self._ttl, str(horizon_ms), str(offset)],
                    lambda r: (int(checked(r)[1]), int(r[2]), int(r[3])))

    def park(self, live: Sequence[tuple[float, int]], *, limit: int = 100,
             now_ms: int = 0) -> Call[tuple[int, int, int]]:
        """(parked, put back, left) of one bounded call of park.lua: tasks no live worker
        (live: their usable GB and GPUs) can hold leave their queues, and come back once one
        can; left: the parked tasks that left `parked`."""
        shapes = [x for gb, gpus in live for x in (num_text(gb), str(gpus))]
        return Call("park", [str(now_ms), self._ttl, str(limit), *shapes],
                    lambda r: (int(checked(r)[1]), int(r[2]), int(r[3])))

    def preempt(self, waiting_id: str, worker_id: str, victim_id: str, victim_token: int, *,
                reserve_ms: int, grace_ms: int | None, now_ms: int = 0,
                also: Sequence[tuple[str, int]] = ()) -> Call[tuple[str, str]]:
        """Commit a planner decision: reserve the worker (grace None), or also ask the victim
        (and ``also``'s further victims on that worker: (id, token)) to yield within
        grace_ms. Replies ("reserved" | "yield" | "stale", why)."""
        args = [str(now_ms), waiting_id, worker_id, victim_id, str(victim_token), str(reserve_ms),
                "" if grace_ms is None else str(grace_ms), *(x for i, t in also for x in (i, str(t)))]
        return Call("preempt", args, lambda r: (str(checked(r)[1]), str(r[2]) if len(r) > 2 else ""))

    def retire(self, worker_id: str, *, now_ms: int = 0) -> Call[tuple[bool, int]]:
        """(retired, live workers before) for an idle worker past its idle timeout."""
        return Call("retire", [worker_id, str(now_ms), str(self.config.min_workers)],
                    lambda r: (int(checked(r)[1]) == 1, int(r[2])))

    def lead(self, token: str, *, release: bool = False) -> Call[bool]:
        ttl = "0" if release else str(int(self.config.reaper_lock_s * 1000))
        return Call("lead", [token, ttl], lambda r: int(checked(r)[1]) == 1)
