"""Batch handlers: one handler call runs several claimed tasks of one handler and model.

A claimed task whose handler has ``batch`` > 1 is the first of a batch: ``fill`` takes up to
``batch - 1`` more queued tasks of its handler and model from its own queue
(claim_batch.lua), each under its own lease and fencing token, their working memory
reserved in the ledger; short of ``batch``, it waits up to ``batch_wait_ms``, never past the
batch's earliest start-by time, and asks once more. A stop, a yield asked of one of its
tasks, or a reservation of the worker for a waiting task (control ``reserved``) ends the
wait at once: the batch runs with what it has, rather than hold the GPU idle. ``run`` calls
the handler once with the payloads and settles each task alone: N results, N acks (sent
together with the runner's next claim, one round trip); a wrong count or a non-list fails
every task with that reason (retried as a handler error); an exception fails each task as it
would fail one task, and an exception in a task's place of the list fails that task alone. A
yield gives every task back (attempt not used); a task stopped past its yield deadline is
requeued by the worker and the others of its batch given back.

Each task's learned run time is the batch's handler time divided by its tasks: the mean
then says how much worker time a task of that handler costs, which is what a backlog's
drain and the scale signals are reckoned from.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

from gpuq.app import App, BatchContext, HandlerSpec, Yielded
from gpuq.claims import Batch
from gpuq.errors import GpuqError, StaleLease, TaskError, TaskNotFound
from gpuq.scripts import Call
from gpuq.worker.broken import skipped
from gpuq.worker.executor import Claimed, Executor
from gpuq.worker.outcome import batch_encode, decode, failure, late, where
from gpuq.worker.running import YIELDED, Running
from gpuq.worker.runtimes import Run

log = logging.getLogger(__name__)
Added = tuple[list[Claimed], int]  # tasks a batch's claim took beside its first, begun; left_ms


def batch_spec(ex: Executor, fields: dict[str, str]) -> HandlerSpec | None:
    """The handler spec of a task whose handler is a batch handler, else None."""
    spec = ex.app.handlers.get(fields.get("handler", ""))
    return spec if spec is not None and spec.batched else None


def wanted(app: App) -> tuple[tuple[str, int], ...]:
    """(handler, n) for each batch handler: a claim taking its task takes n more (ClaimRequest)."""
    return tuple((name, spec.batch - 1) for name, spec in app.handlers.items()
                 if spec.batched and spec.batch > 1)


def begin_added(ex: Executor, batch: Batch | None) -> Added | None:
    """Begin the tasks a claim took beside a batch handler's task (with the cache lock held,
    as the claim); None when it did not try."""
    if batch is None:
        return None
    added = [(t, *ex.begin(t, batched=True, track=False)) for t in batch.tasks]
    ex.running.track(*(run for _, _, run in added))
    return added, batch.left_ms


def execute(ex: Executor, claimed: Claimed, stopping: threading.Event | None = None,
            added: Added | None = None, *, handed: bool = False) -> list[Call[Any]]:
    """Run a claimed task (``handed``: handed over at enqueue), with the batch it starts
    when its handler is a batch handler (``added``: what its claim took beside it); the
    calls that settle its tasks. ``stopping`` None: a batch does not wait for more."""
    spec = batch_spec(ex, claimed[0])
    if spec is None:
        call = ex.execute(*claimed)
        return [] if call is None else [call]
    return run(ex, spec, fill(ex, spec, claimed, stopping, added, handed=handed))


def fill(ex: Executor, spec: HandlerSpec, first: Claimed, stopping: threading.Event | None,
         added: Added | None = None, *, handed: bool = False) -> list[Claimed]:
    """The batch the claimed task ``first`` starts: it, what its claim took beside it
    (``added``; None: the claim did not try, claim_batch is asked at once) and what
    claim_batch adds after the batch's wait. A task handed over to a worker holding its
    model starts at once, alone, unless its handler waits for a batch (batch_wait_ms):
    enqueue hands a task only to an idle worker, whose queues held nothing for it, and an
    online request must not pay a round trip to find that out; what queues meanwhile
    goes with the worker's next claim."""
    items = [first, *(added[0] if added else [])]
    if first[1] is None or first[2].rejected:  # execute fails it alone
        return items
    if handed and not first[1].cold:
        if spec.batch_wait_ms <= 0:
            return items
        if not ex.take_up(*first, now=True):  # the wait may outlast its pickup deadline
            return []
    left_ms, waited = None if added is None else added[1], False
    while len(items) < spec.batch:
        if left_ms is None or waited:
            got = claim_more(ex, first, spec.batch - len(items), stopping)
            if got is None:
                break
            items += got[0]
            left_ms = got[1]
        wait_s = min(spec.batch_wait_ms, left_ms) / 1000
        if waited or stopping is None or len(items) >= spec.batch or wait_s <= 0:
            break
        if wait_for_more(ex, items, stopping, wait_s):
            break  # cut short: it runs with what it has
        waited = True
    if len(items) > 1:
        log.debug("batch.claimed worker=%s handler=%s tasks=%d", ex.id, spec.name, len(items))
    return items


def wait_for_more(ex: Executor, items: list[Claimed], stopping: threading.Event,
                  wait_s: float) -> bool:
    """The batch's wait for more tasks; True when cut short by a stop, a yield asked of one
    of its tasks, or a reservation of this worker for a waiting task (its next claim): the
    batch then runs with what it has, rather than hold the GPU idle."""
    runs, seen = [r for _, _, r in items], ex.running.reservations

    def cut() -> bool:
        return (stopping.is_set() or ex.running.reservations != seen
                or any(r.ctx.yield_requested for r in runs))

    ex.running.wait_until(cut, wait_s)
    return cut()


def claim_more(ex: Executor, first: Claimed, count: int,
               stopping: threading.Event | None) -> Added | None:
    """claim_batch for up to count more tasks, begun; None when stopping, when the first
    task is gone (it runs alone: moot), or when the call fails (Redis away or refusing): the
    batch runs with what it has, since its tasks hold their memory and slots until run
    settles them, and a raise here would skip that."""
    fields, res, _ = first
    assert res is not None
    with ex.cache.lock:
        if stopping is not None and stopping.is_set():
            return None
        footprint = ex.cache.get(res.model).footprint_gb
        call = ex.calls.claim_batch(ex.id, fields, ex.cache.free_gb(), footprint,
                                    not (res.cold or res.waits), count)
        try:
            return begin_added(ex, ex.scripts.run(call))
        except (StaleLease, TaskNotFound):
            return None
        except (redis.RedisError, GpuqError) as exc:
            log.warning("batch.claim_failed worker=%s handler=%s error=%s: running the batch as "
                        "it is", ex.id, fields.get("handler"), exc)
            return None


def report_starts(ex: Executor, items: list[Claimed], *, warm: bool = False) -> list[Claimed]:
    """began.lua for each task started cold or handed over (``warm``: no load before the
    handler), in one round trip; the tasks still to run (one whose lease is gone belongs to
    another attempt)."""
    asked = [(item, ex.calls.began(item[2].task_id, item[2].token, warm=warm)) for item in items
             if item[0].get("sla") == "pending"]
    if not asked:
        return items
    try:
        replies = ex.scripts.pipelined([call for _, call in asked])
    except redis.RedisError as exc:  # the handler still runs; only the SLAs go uncounted
        log.warning("sla.unreported worker=%s tasks=%d error=%s", ex.id, len(asked), exc)
        return items
    lost = set()
    for (item, call), reply in zip(asked, replies):
        try:
            decided, now_ms = call.parse(reply)
        except (StaleLease, TaskNotFound):
            log.warning("lease.lost task=%s worker=%s: lost during its model load",
                        item[2].task_id, ex.id)
            ex.observer.observe(item[2].task_id, "lost")
            lost.add(item[2].task_id)
            continue
        if decided:
            ex.observer.began(item[0], now_ms)
    return [item for item in items if item[2].task_id not in lost]


def start(ex: Executor, items: list[Claimed], loaded: bool) -> list[Claimed]:
    """The tasks whose handler starts now, taken up: a warm hand-over started alone (no
    batch wait) as a single handler's is, its began not waited for while in time
    (Executor.taken_up); any other began in one round trip (``report_starts``)."""
    fields, res, running = items[0] if len(items) == 1 else ({}, None, None)
    if running is not None and running.handed and res is not None and not loaded:
        if fields.get("sla") != "pending" or ex.taken_up(fields, res, running):
            return items
        ex.observer.observe(running.task_id, "lost")
        return []
    return report_starts(ex, items, warm=not loaded)


def run(ex: Executor, spec: HandlerSpec, items: list[Claimed]) -> list[Call[Any]]:
    """Call the batch handler once for the tasks and settle each; their VRAM and slots are
    released first."""
    calls: list[Call[Any]] = []
    live: list[Claimed] = []
    for item in items:
        if item[1] is None or item[2].rejected:
            call = ex.execute(*item)  # fails it alone, with the reason
            calls += [] if call is None else [call]
        else:
            live.append(item)
    try:
        if live:
            calls += settle(ex, spec, live)
    finally:
        for _, res, running in live:
            ex.release(running, res)
            if running.stopped:  # counted: "stopped" when requeued, else "lost" (its lease gone)
                ex.moot(running)
        ex.running.untrack(*(running for _, _, running in live))
    return calls


def settle(ex: Executor, spec: HandlerSpec, items: list[Claimed]) -> list[Call[Any]]:
    """Run the handler on the live tasks; one ack, fail or requeue per task not stopped."""
    calls: list[Call[Any]] = []
    try:
        model, (first, res, _) = None, items[0]
        if res is not None and res.cold and ex.broken.skips(first):  # its claims skip the model
            return [ex.pass_on(r, skipped(r.ctx.model), "another worker may load it") for _, _, r in items]
        for i, (_, res, running) in enumerate(items):
            # the first loads the model if cold; the rest share it (one evicts only if the
            # ledger had to make room for its working memory)
            if res is not None and (i == 0 or res.cold or res.evict):
                model = ex.loading.prepare(res, running.task_id)
        calls = [ex.yielded(r) for r in kept(ex, [i for i in items if i[2].ctx.yield_requested],
                                             "yield")]  # asked during the load: not run
        loaded = any(res is not None and (res.cold or res.waits) for _, res, _ in items)
        items = start(ex, [i for i in items if not (i[2].ctx.yield_requested or i[2].stopped)], loaded)
        if not items:
            return calls
        runs = [r for _, _, r in items]
        payloads = [decode(f["payload"]) for f, _, _ in items]
        began = time.monotonic()
        results = ex.invoke(spec, runs, model, payloads, BatchContext([r.ctx for r in runs]))
        ran_s = time.monotonic() - began
    except Yielded:
        return calls + [ex.yielded(r) if r.ctx.yield_requested
                        else give_back(ex, r, f"its batch {YIELDED}", "")
                        for r in kept(ex, items, "yield")]
    except BaseException as exc:  # sys.exit(), KeyboardInterrupt...: must not end the runner
        if any(r.stopped for _, _, r in items):  # a task stopped past its yield deadline
            return calls + [give_back(ex, r, "its batch was stopped", "")
                            for r in kept(ex, items, "give-back")]
        message, retry = failure(exc)
        if ex.broken.passes(exc, items[0][0]):
            return calls + [ex.pass_on(r, message, "another worker may load its model")
                            for r in kept(ex, items, "failure")]
        log.info("task.failed tasks=%d worker=%s retryable=%s error=%s", len(items), ex.id, retry, message,
                 exc_info=where(exc))
        return calls + [ex.calls.fail(r.task_id, r.token, message, retry=retry)
                        for r in kept(ex, items, "failure")]
    return calls + results_of(ex, spec, items, results, ran_s)


def settle_all(ex: Executor, calls: list[Call[Any]], replies: list[Any]) -> None:
    """``Executor.settle`` each call with its reply; the acks answered OK (a batch's, its
    usual end) under one lock for their renewals and one for their runs, rather than two a
    task; a runner's one ack answered OK without its reply parsed (three calls fewer).
    Never raises, as settle."""
    if len(calls) < 2:
        for call, reply in zip(calls, replies):
            if call.script != "ack" or type(reply) is not list or not reply or reply[0] != 0:
                ex.settle(call, reply)
                continue
            task_id, token = call.args[0], call.args[1]
            try:
                ex.running.settled(task_id, int(token))
                if (run := ex.unacked.pop((task_id, token), None)) is not None:
                    ex.runtimes.add(*run)
                if ex.observer.metrics is not None:
                    ex.observer.observe(task_id, "succeeded")
            except Exception:  # as settle: said; the run is renewed until its lease is dropped
                log.exception("task.settle_failed task=%s worker=%s", task_id, ex.id)
        return
    ended: list[tuple[str, int]] = []
    runs: list[Run] = []
    observed = ex.observer.metrics is not None
    try:
        for call, reply in zip(calls, replies):
            if call.script != "ack" or type(reply) is not list or not reply or reply[0] != 0:
                ex.settle(call, reply)
                continue
            task_id, token = call.args[0], call.args[1]
            ended.append((task_id, int(token)))
            if (run := ex.unacked.pop((task_id, token), None)) is not None:
                runs.append(run)
            if observed:
                ex.observer.observe(task_id, "succeeded")
    except Exception:  # counted wrong: said; the runs not yet settled are renewed until they are
        log.exception("task.settle_failed worker=%s tasks=%d", ex.id, len(calls))
    finally:
        ex.running.settled_all(ended)
        ex.runtimes.add_all(runs)


def kept(ex: Executor, items: list[Claimed], what: str) -> list[Running]:
    """The runs whose yield or failure goes out: not a stopped one (requeued; counted by
    ``run``), nor one canceled or taken back, whose end is moot (Executor.lost)."""
    return [r for _, _, r in items if not r.stopped and not ex.lost(r, what)]


def give_back(ex: Executor, r: Running, reason: str, preempted: str) -> Call[Any]:
    """The requeue of a batch's task that gives way (its attempt given back)."""
    return ex.calls.requeue(r.task_id, r.token, reason, preempted=preempted,
                            checkpoint=r.ctx.saved or "")


def results_of(ex: Executor, spec: HandlerSpec, items: list[Claimed], results: Any,
               ran_s: float) -> list[Call[Any]]:
    """One ack per task for a list of one result per task (a fail for an exception in the
    list); else every task fails."""
    n = len(items)
    if ex.observer.metrics is not None:
        for _, _, r in items:
            ex.observer.observe(r.task_id, phase="run", seconds=ran_s)
    if not isinstance(results, list) or len(results) != n:
        got = (f"{len(results)} results" if isinstance(results, list)
               else f"a {type(results).__name__}, not a list,")
        message = f"batch handler {spec.name!r} returned {got} for {n} task{'s' if n != 1 else ''}"
        log.info("task.failed tasks=%d worker=%s retryable=True error=%s", n, ex.id, message)
        return [ex.calls.fail(r.task_id, r.token, message) for r in kept(ex, items, "failure")]
    calls: list[Call[Any]] = []
    encode = batch_encode()
    run: Run = (items[0][0]["handler"], items[0][0]["model"], ran_s / n)  # the batch's tasks share it
    for (_, _, r), result in zip(items, results):
        if r.stopped:  # no ack goes out: said, as for one task (Executor.execute)
            log.warning("lease.lost task=%s worker=%s: result discarded (its run was stopped)",
                        r.task_id, ex.id)
            continue
        if r.run_deadline is not None and (fail := late(ex.calls, ex.id, r)) is not None:
            calls.append(fail)  # past its timeout_s (Executor.execute)
            continue
        if isinstance(result, BaseException):  # the handler failed this task alone
            message, retry = failure(result)
            log.info("task.failed task=%s worker=%s retryable=%s error=%s", r.task_id, ex.id, retry,
                     message, exc_info=where(result))
            calls.append(ex.calls.fail(r.task_id, r.token, message, retry=retry))
            continue
        try:
            ack = ex.calls.ack(r.task_id, r.token, encode(result))
        except TaskError as exc:  # this result alone cannot be stored
            calls.append(ex.calls.fail(r.task_id, r.token, str(exc), retry=exc.retry))
            continue
        ex.unacked[(r.task_id, ack.args[1])] = run
        calls.append(ack)
    return calls
