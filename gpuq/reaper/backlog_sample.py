"""The backlog sample a scale step plans from: per (priority, model) queue its depth, its
head's start-by and the vram_gb, est_s and gpus of its first tasks, read within a bounded
number of task reads a round however many queues have work (``Samples``); and the shapes of
the queued tasks across several GPUs, in their queues or parked, from their ``need`` scores."""

from __future__ import annotations

import math
from typing import Any

import redis

from gpuq import shapes
from gpuq.keys import Keys
from gpuq.reaper.snapshot import Backlog
from gpuq.shapes import Shape

SAMPLE = 50  # head tasks read per queue of the DEEP deepest; their est_s and vram_gb stand for it
SAMPLE_REST = 4  # head tasks read per other queue
DEEP = 64  # queues sampled SAMPLE deep, the deepest (most of the backlog's work) first
# task reads a round's sample makes at most (Samples): past it, every queue's head is read
# and the rest of the budget samples the queues sampled longest ago in full
SAMPLE_BUDGET = 2048
WIDE_SAMPLE = 128  # tasks across several GPUs read (by score) from each end of `need` and `parked`
TASK_FIELDS = ("vram_gb", "est_s", "handler", "score", "tenant", "gpus")  # a sampled task's


def as_float(value: object) -> float:
    """A reply's number, 0.0 for what is not one."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


def deepen(client: redis.Redis, keys: Keys, queues: list[tuple[int, str, int, list[Any]]],
           reads: list[int]) -> list[tuple[int, str, int, list[Any]]]:
    """The heads of the queues to be read past SAMPLE_REST tasks (reads: how many a queue;
    at most the DEEP deepest, so the sample follows the backlog's work while its cost stays
    bounded: 25,000 task reads a round at 500 models of 100 tasks before DEEP) read on."""
    deep = [i for i, n in enumerate(reads) if n > SAMPLE_REST]
    if not deep:
        return queues
    pipe = client.pipeline(transaction=False)
    for i in deep:
        p, m, _, _ = queues[i]
        pipe.zrange(keys.queue(p, m), SAMPLE_REST, reads[i] - 1, withscores=True)
    out = list(queues)
    for i, more in zip(deep, pipe.execute()):
        p, m, depth, head = out[i]
        out[i] = (p, m, depth, [*head, *more])
    return out


def read_backlogs(client: redis.Redis, keys: Keys,
                  queues: list[tuple[int, str, int, list[tuple[str, float]]]],
                  reads: list[int], bounds: list[float], held_back: frozenset[str] = frozenset(),
                  rows: TaskRows | None = None
                  ) -> tuple[list[Backlog], tuple[tuple[float, int], ...], list[str], tuple[Shape, ...]]:
    """Each queue's backlog from its first head tasks (reads: how many a queue), the need
    bands of one-GPU tasks, the sampled tasks' handlers, and the shapes of the queued and the
    parked tasks across several GPUs, up to WIDE_SAMPLE from each end of their scores (the
    fewest GPUs and least VRAM, the most GPUs and VRAM), so each shape's class is seen.
    held_back: tenants at a cap or bound; their sampled tasks are left out and the queue's
    depth shrinks by their share of the sample. rows: the sampled tasks' fields as last
    read (``TaskRows``): only the tasks not among them are read."""
    rows = TaskRows() if rows is None else rows
    heads = [[(str(tid), float(score)) for tid, score in head[:n]] for (*_, head), n in zip(queues, reads)]
    unread = [t for (p, m, _, _), head in zip(queues, heads) for t in rows.unread((p, m), head)]
    pipe = client.pipeline(transaction=False)
    for tid, _ in unread:
        pipe.hmget(keys.task(tid), *TASK_FIELDS)
    lower, wide = "-inf", repr(2 * shapes.WIDE)
    for bound in bounds:  # queued tasks' needs: in their queues, and parked (lua/park.lua)
        for key in (keys.need, keys.parked):
            pipe.zcount(key, lower, f"({wide}" if math.isinf(bound) else bound)
        lower = f"({bound}"
    for key in (keys.need, keys.parked):  # the fewest GPUs and the most: every class asked for
        pipe.zrangebyscore(key, wide, "+inf", 0, WIDE_SAMPLE, withscores=True)
        pipe.zrevrangebyscore(key, "+inf", wide, 0, WIDE_SAMPLE, withscores=True)
    *replies_list, few_queued, most_queued, few_parked, most_parked = pipe.execute()
    fields = rows.update([(p, m) for p, m, _, _ in queues], heads, dict(zip(unread, replies_list)))
    replies = iter(fields)
    sampled = {**dict(few_queued), **dict(most_queued)}, {**dict(few_parked), **dict(most_parked)}
    backlogs, named = [], []
    for (p, m, depth, head), n in zip(queues, reads):
        # a task that ended between the reads has no hash left: it is just not sampled
        read = [t for t in (next(replies) for _ in head[:n]) if t[0] is not None]
        named += [str(h) for _, _, h, _, _, _ in read if h]
        got = [t for t in read if t[4] not in held_back]
        if len(got) < len(read):
            depth = round(depth * len(got) / len(read))
        sample = tuple((as_float(v), as_float(e), shapes.gpus_of(g)) for v, e, _, _, _, g in got)
        # the head's start-by: its `score` (the queue's score is its fair order with tenants)
        start_by = as_float(got[0][3]) if got and got[0][3] is not None else (
            float(head[0][1]) if head and len(got) == len(read) else math.inf)
        backlogs.append(Backlog(p, m, depth, start_by, sample))
    counts = [int(n) for n in replies_list[len(unread):]]
    bands = tuple(zip(bounds, (a + b for a, b in zip(counts[::2], counts[1::2]))))
    return backlogs, bands, named, tuple(shapes.shape_of(s) for got in sampled for s in got.values())


class TaskRows:
    """The sampled queued tasks' fields (TASK_FIELDS) as last read, per queue, so a round
    reads only the tasks new to its sample: none of them changes while its task stays queued
    (enqueue writes them; a task given a new start-by left its queue for it and comes back
    under another queue score). Kept by (task, queue score): per queue those of this round's
    read and those kept behind its last task (a queue read only at its head this round keeps
    its last full read's); those before it in the queue's order have left it."""

    def __init__(self) -> None:
        self.kept: dict[tuple[int, str], dict[tuple[str, float], tuple[Any, ...]]] = {}

    def unread(self, queue: tuple[int, str], head: list[tuple[str, float]]) -> list[tuple[str, float]]:
        old = self.kept.get(queue, {})
        return [t for t in head if t not in old]

    def update(self, queues: list[tuple[int, str]], heads: list[list[tuple[str, float]]],
               fresh: dict[tuple[str, float], Any]) -> list[tuple[Any, ...]]:
        """The fields of each queue's head tasks, in order: those just read (fresh), the
        others kept; a task whose hash was gone is not kept (and reads as gone). Queues not
        read this round are forgotten."""
        out: list[tuple[Any, ...]] = []
        kept = {}
        for queue, head in zip(queues, heads):
            old = self.kept.get(queue, {})
            got = [tuple(fresh[t]) if t in fresh else old[t] for t in head]
            out += got
            rows = {t: f for t, f in zip(head, got) if f[0] is not None}
            if head:  # a sorted set's order: by score, then by member
                last = (head[-1][1], head[-1][0])
                rows.update((t, f) for t, f in old.items() if (t[1], t[0]) > last)
            kept[queue] = rows
        self.kept = kept
        return out


class Samples:
    """Each queue's last full sample, so that a round stays within SAMPLE_BUDGET task reads
    however many queues have work. While the queues want no more, every one is read in
    full each round. Past it, every queue's head is read (its start-by stays fresh) and the
    rest of the budget reads in full the queues read in full longest ago (never first, then
    the deepest); the others' work and need come from their kept sample. A queued task's
    est_s and vram_gb never change, so a kept sample ages only as its queue drains; at
    1,000 queues of 1,000 tasks, about every sixth round."""

    def __init__(self, budget: int = SAMPLE_BUDGET) -> None:
        self.budget = budget
        # (priority, model) -> (when it was read in full, ms; its sample)
        self.kept: dict[tuple[int, str], tuple[int, tuple[tuple[float, float, int], ...]]] = {}
        self.full: set[int] = set()  # this round's queues read in full, by index
        self.rows = TaskRows()  # the fields of the tasks sampled last round

    def reads(self, queues: list[tuple[int, str, int]]) -> list[int]:
        """How many head tasks to read of each queue (priority, model, depth) this round."""
        deep = set(sorted((i for i, q in enumerate(queues) if q[2] > SAMPLE_REST),
                          key=lambda i: (-queues[i][2], i))[:DEEP])
        want = [min(q[2], SAMPLE if i in deep else SAMPLE_REST) for i, q in enumerate(queues)]
        if sum(want) <= self.budget:
            self.full = set(range(len(queues)))
            return want
        reads = [min(n, 1) for n in want]
        left = self.budget - sum(reads)
        never = (-1, 0)
        order = sorted(range(len(queues)), key=lambda i: (
            self.kept.get((queues[i][0], queues[i][1]), never)[0], -queues[i][2], i))
        self.full = set()
        for i in order:
            more = want[i] - reads[i]
            if more <= left:
                reads[i], left = want[i], left - more
                self.full.add(i)
        return reads

    def fill(self, backlogs: list[Backlog], now_ms: int) -> tuple[Backlog, ...]:
        """The backlogs, those whose queue was not read in full with its kept sample (if
        any); the full reads kept, queues gone from the index forgotten."""
        out, kept = [], {}
        for i, b in enumerate(backlogs):
            key = (b.priority, b.model)
            old = self.kept.get(key)
            if i in self.full:
                kept[key] = (now_ms, b.sample)
                out.append(b)
            elif old is not None and old[0] >= 0:
                kept[key] = old
                out.append(Backlog(b.priority, b.model, b.depth, b.head_ms, old[1]))
            else:  # never read in full: its head stands for it
                kept[key] = (-1, b.sample)
                out.append(b)
        self.kept = kept
        return tuple(out)
