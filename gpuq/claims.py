"""What a worker sends the claim scripts about itself, and what they answer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from gpuq.lua_source import reply_fields
from gpuq.replies import checked

# A claimed task's fields, in the order of the claim reply's values (lib/take.lua names them)
TASK_FIELDS = reply_fields("take", "task")
# A task taken beside a batch's first: the values that differ from the first's, in order
BATCHED_FIELDS = reply_fields("take", "batched")


@dataclass(frozen=True)
class ClaimRequest:
    """What a worker tells the claim script about itself."""

    worker_id: str
    free_gb: float
    evictable_gb: float
    slots: int
    loaded: Sequence[tuple[str, float]] = ()  # (model, footprint GB)
    levels: str = "0123"
    gpus: int = 1  # devices of the worker's group
    in_use: frozenset[str] = frozenset()  # loaded models a running task of the worker uses
    # (handler, n): a claim that takes a task of this batch handler on a held model takes
    # up to n more of its queue beside it (lib/batch.lua)
    batches: Sequence[tuple[str, int]] = ()
    # the worker's last claim told it to look again (retry_ms > 0): it is its shape's
    # lookout until this claim (lib/lookout.lua)
    lookout: bool = False
    # the worker knows it is not in `idle`: it has one slot, and its last claim (or a
    # hand-over) gave it a task; only a claim that found nothing lists it there again
    unlisted: bool = False
    # (model, ms) of models whose load failed on this worker lately: the claim passes their
    # queues over, and offers pass the worker over for them, that long (gpuq.worker.broken)
    skipped: Sequence[tuple[str, int]] = ()
    # loaded models whose load has not ended (also in in_use): a task of one waits for it,
    # so the claim starts it cold, its SLA decided when its handler starts (began.lua)
    loading: frozenset[str] = frozenset()

    def fits(self, model: str, need_gb: float, gpus: int = 1) -> bool:
        """claim.lua's fit rule: a task asks no more devices than the group has; a held
        model's task needs room for its working memory (free VRAM plus the other idle models),
        another task for all of it (free plus idle models)."""
        if gpus > self.gpus:
            return False
        footprint = dict(self.loaded).get(model)
        if footprint is not None:
            idle_gb = 0.0 if model in self.in_use else footprint  # in evictable_gb while idle
            return need_gb - footprint <= self.free_gb + max(0.0, self.evictable_gb - idle_gb)
        return need_gb <= self.free_gb + self.evictable_gb


class Claim(NamedTuple):
    """A claim's answer: the task's fields, or None and when a deferred task may be retried.
    A tuple, one a task: cheaper to build than a frozen dataclass (gpuq.call)."""

    task: dict[str, str] | None
    retry_s: float = 0.0  # > 0: a task was left for a better-placed worker until then
    batch: Batch | None = None  # the tasks taken beside a batch handler's (None: not tried)

    @classmethod
    def parse(cls, reply: list[Any]) -> Claim:
        if reply[0] != 0:
            checked(reply)
        if str(reply[1]) != "task":
            return cls(None, int(reply[2]) / 1000.0)
        end = 2 + len(TASK_FIELDS)
        task = dict(zip(TASK_FIELDS, reply[2:end]))
        task["token"] = str(task["token"])  # the one number among the values
        return cls(task, batch=Batch.of(reply[end:], task) if len(reply) > end else None)


@dataclass(frozen=True)
class Batch:
    """claim_batch's answer: the tasks added to a batch (claim reply fields each; the script
    sends the values that differ from the first task's, in BATCHED_FIELDS order)."""

    tasks: list[dict[str, str]]
    left_ms: int  # from the server's now to the batch's earliest start-by score (< 0: past)

    @classmethod
    def parse(cls, reply: list[Any], first: Mapping[str, str]) -> Batch:
        return cls.of(checked(reply)[1:], first)

    @classmethod
    def of(cls, reply: Sequence[Any], first: Mapping[str, str]) -> Batch:
        """From left_ms, started_at, then each task's values; ``first``: the batch's first
        task's fields (its handler, model and priority are each task's)."""
        shared = {name: first.get(name, "") for name in ("handler", "model", "priority")}
        shared["started_at"] = str(reply[1])
        tasks = []
        for values in reply[2:]:
            task = dict(zip(BATCHED_FIELDS, values))
            task["token"] = str(task["token"])  # the one number among the values
            task.update(shared)
            tasks.append(task)
        return cls(tasks, int(reply[0]))
