"""Runs one claimed task: load its model if cold, call its handler, ack or fail it (fenced).

A blocking handler runs in the runner thread; an ``async def`` one on the worker's event
loop while the runner thread waits for it (``invoke``; gpuq.worker.eventloop). A successful
run's handler time goes to the worker's ``RunTimes`` once its ack succeeds; the heartbeat
thread sends them to learn.lua (``gpuq.worker.runtimes``)."""

from __future__ import annotations

import functools
import json
import logging
import math
import threading
import time
from types import CoroutineType
from typing import Any

import redis

from gpuq.app import App, Context, HandlerSpec, Yielded
from gpuq.errors import GpuqError, StaleLease, TaskError, TaskNotFound
from gpuq.scripts import Call, Calls, Scripts
from gpuq.stream import Emitter
from gpuq.worker.broken import Broken, skipped
from gpuq.worker.loading import Loading
from gpuq.worker.models import ModelCache, Reservation
from gpuq.worker.observer import Observer
from gpuq.worker.outcome import decode, failure, kept_encode, late, where
from gpuq.worker.passing import PASS_S, Elsewhere
from gpuq.worker.presence import Presence
from gpuq.worker.running import Running, RunningSet
from gpuq.worker.runtimes import NAMES_KEPT, Run, RunTimes
from gpuq.worker.takeup import TakeUps, in_time

log = logging.getLogger(__name__)
Claimed = tuple[dict[str, str], Reservation | None, Running]  # task fields, its VRAM, its run

SETTLED = {"ack": "succeeded", "requeue": "yielded"}
# fail's replies: "delayed" a retry, "passed" given to the workers that run its handler
FAILED = {"delayed": "retried", "passed": "passed"}
UNREADABLE = "task fields cannot be read"


class Executor:
    def __init__(self, app: App, cache: ModelCache, presence: Presence, running: RunningSet,
                 scripts: Scripts, calls: Calls, observer: Observer, runtimes: RunTimes,
                 gpus: int = 1) -> None:
        self.app = app
        self.cache = cache
        self.presence = presence
        self.running = running
        self.scripts = scripts
        self.calls = calls
        self.observer = observer
        self.elsewhere = Elsewhere(presence)  # who else runs a handler this app lacks
        config = calls.config  # models whose load failed here: claims skip them for a backoff
        self.broken = Broken(self.elsewhere, config.load_backoff_s, config.load_backoff_max_s)
        self.runtimes = runtimes
        # (task id, token) -> its run, until its ack's reply: only an acked run is learned
        self.unacked: dict[tuple[str, str], Run] = {}
        self.id = presence.worker_id
        self.loading = Loading(cache, presence, self.broken, observer, gpus)  # its models' loads
        self.takeups = TakeUps(scripts, calls, observer, presence)  # warm hand-overs' began
        # why this app cannot run (handler, model), None: it can; the app's handlers and
        # loaders are fixed once the worker runs, and a batch asks once per task
        self._check = functools.lru_cache(maxsize=NAMES_KEPT)(app.check)

    def begin(self, fields: dict[str, str], *, batched: bool = False,
              track: bool = True) -> tuple[Reservation | None, Running]:
        """Take a task this worker now runs (claimed, handed over at enqueue, or added to a
        batch: ``batched``, no slot of its own): its VRAM, its context, its slot (unless
        ``track`` is False: the caller tracks a batch's runs at once). Called with the cache
        lock held."""
        ctx, problem = self.context_of(fields)
        # a task this worker cannot run reserves nothing: execute fails it, and a reservation
        # would have evicted held models and left a placeholder that never loads
        res = None if problem else self.cache.reserve_held(ctx.model, ctx.vram_gb)
        running = Running(fields["id"], int(fields["token"]), ctx, time.monotonic(),
                          threading.get_ident(), rejected=problem, batched=batched, reservation=res)
        # ctx.emit and ctx.progress: sent at once, fenced by this run's token (gpuq.stream);
        # made at the first of them (most runs emit nothing)
        ctx.new_sink = functools.partial(Emitter, self.scripts, self.calls.config, running.task_id,
                                         running.token)
        if self.observer.metrics is not None:  # off (no --metrics-port): no call a task
            self.observer.started(fields)
        if track:  # before the lock is released: the next claim sees one slot fewer
            self.running.track(running)
        return res, running

    def take_up(self, fields: dict[str, str], res: Reservation | None, running: Running,
                *, now: bool = False) -> bool:
        """A hand-over not taken up by its pickup deadline is taken back (a worker frozen when
        the server popped it for it, lib/due.lua): a warm one is taken up by began as its
        handler starts (gpuq.worker.takeup); a cold one here, before its load, by renewing
        its lease, as a warm one is (``now``) before a batch's wait for more tasks. False
        when it was taken back (its run released): another worker runs it."""
        if res is None or not (res.cold or now):
            running.handed = res is not None
            return True
        running.handed = False  # taken up here: its began, when it starts, is a plain start's
        try:
            _revived, lost = self.scripts.run(self.calls.heartbeat(self.id, [(running.task_id,
                                                                              running.token)]))
        except redis.RedisError as exc:  # the next beat takes it up, or the task comes back
            log.warning("task.untaken task=%s worker=%s error=%s", running.task_id, self.id, exc)
            return True
        if not lost:
            return True
        log.warning("lease.lost task=%s worker=%s: taken back before it was taken up",
                    running.task_id, self.id)
        self.cache.release(res)
        self.running.untrack(running)
        self.observer.observe(running.task_id, "lost")
        return False

    def context_of(self, fields: dict[str, str]) -> tuple[Context, str | None]:
        """The task's context, and why this worker cannot run it (None: it can). A hash
        written or damaged by hand fails its task with the reason rather than the runner."""
        try:
            saved = fields.get("checkpoint")
            ctx = Context(fields["id"], int(fields["attempt"]), self.id, fields["model"],
                          float(fields["vram_gb"]), float(fields["est_s"]),
                          json.loads(saved) if saved else None)
            if not 0 < ctx.vram_gb < math.inf or not 0 <= ctx.est_s < math.inf:
                raise ValueError(f"vram_gb {fields['vram_gb']!r}, est_s {fields['est_s']!r}")
            return ctx, self._check(fields["handler"], fields["model"])
        except (KeyError, ValueError) as exc:
            stand_in = Context(fields["id"], 0, self.id, fields.get("model", ""), 0.0, 0.0)
            return stand_in, f"{UNREADABLE}: {type(exc).__name__}: {exc}"

    def execute(self, fields: dict[str, str], res: Reservation | None,
                running: Running) -> Call[Any] | None:
        """Run the task; return its ack, fail or yield call, which the runner sends together
        with its next claim (one round trip per task), or None when the worker already
        requeued it (stopped past its yield deadline). The task's VRAM and slot are released
        first."""
        task_id, token, ctx = running.task_id, running.token, running.ctx
        try:
            if running.rejected:
                handler = fields.get("handler", "")
                if (not running.rejected.startswith(UNREADABLE) and handler not in self.app.handlers
                        and self.elsewhere.runs_task(fields)):
                    return self.pass_on(running, running.rejected, "another worker runs it")
                raise TaskError(running.rejected, False)
            if res is None:
                raise TaskError(f"task needs {fields['vram_gb']} GB with model {fields['model']}, "
                                f"more than this GPU can free", True)
            if res.cold and self.broken.skips(fields):
                return self.pass_on(running, skipped(ctx.model), "another worker may load it")
            model = self.loading.prepare(res, task_id)
            if ctx.yield_requested or running.stopped:
                # asked to yield (or stopped) while its model loaded: give way before the
                # handler starts, whether or not the handler would check soon; its checkpoint stays
                raise Yielded(task_id)
            spec = self.app.handlers[fields["handler"]]
            payload = decode(fields["payload"])
            if fields.get("sla") == "pending" and not self.taken_up(fields, res, running):
                self.observer.observe(task_id, "lost")
                return None
            began = time.monotonic()
            try:
                result = self.invoke(spec, [running], model, payload, ctx)
            finally:  # a run that raised spent its GPU time too
                ran_s = time.monotonic() - began
                if self.observer.metrics is not None:
                    self.observer.observe(task_id, phase="run", seconds=ran_s)
            if running.stopped:
                # its handler returned a result all the same: no ack goes out, so say it was
                # thrown away, as for a late ack the server refuses
                log.warning("lease.lost task=%s worker=%s: result discarded (its run was stopped)",
                            task_id, self.id)
                self.moot(running)
                return None
            if running.run_deadline is not None and (fail := late(self.calls, self.id, running)):
                return fail
            ack = self.calls.ack(task_id, token, kept_encode(result))
            self.unacked[(task_id, ack.args[1])] = (fields["handler"], fields["model"], ran_s)
            return ack
        except Yielded:
            return self.yielded(running) if not self.lost(running, "yield") else None
        except BaseException as exc:  # sys.exit(), KeyboardInterrupt...: must not end the runner
            if running.stopped:  # StopTask, or whatever the stop broke: the task is requeued
                self.moot(running)
                return None
            if self.lost(running, "failure"):
                return None
            message, retry = failure(exc)
            if self.broken.passes(exc, fields):
                return self.pass_on(running, message, "another worker may load its model")
            log.info("task.failed task=%s worker=%s retryable=%s error=%s", task_id, self.id, retry,
                     message, exc_info=where(exc))
            return self.calls.fail(task_id, token, message, retry=retry)
        finally:
            self.release(running, res)
            self.running.untrack(running)

    def lost(self, running: Running, what: str) -> bool:
        """Whether the run is no longer this worker's (stopped, canceled, its lease lost): its
        handler's yield or failure is then moot, not sent for the server to refuse."""
        if not (running.stopped or running.ctx.lost):
            return False
        if not running.stopped:
            log.info("lease.lost task=%s worker=%s: %s not sent (its run was canceled or taken back)",
                     running.task_id, self.id, what)
        self.moot(running)
        return True

    def yielded(self, running: Running) -> Call[Any]:
        """The requeue of a run whose handler yielded (or that was asked to before its
        handler started), with its checkpoint, its attempt given back."""
        reason, preempted = running.gives_way()
        saved = "saved" if running.ctx.saved else "none"
        if preempted:
            log.info("preempt.yielded task=%s worker=%s checkpoint=%s", running.task_id, self.id, saved)
        else:  # given back as the shutdown's give-back is, and said in its words
            log.info("task.requeued task=%s worker=%s reason=yielded_at_shutdown checkpoint=%s",
                     running.task_id, self.id, saved)
        return self.calls.requeue(running.task_id, running.token, reason, preempted=preempted,
                                  checkpoint=running.ctx.saved or "")

    def pass_on(self, running: Running, error: str, why: str) -> Call[Any]:
        """Give a task to the other workers: its attempt given back, it waits PASS_S, and
        this runner claims nothing for as long (gpuq.worker.passing)."""
        log.warning("task.passed task=%s worker=%s error=%s (%s)", running.task_id, self.id, error, why)
        return self.calls.fail(running.task_id, running.token, error, pass_ms=int(PASS_S * 1000))

    def release(self, running: Running, res: Reservation | None = None) -> None:
        """Give back the memory of a run (``res``, else the reservation it began with), once."""
        res, running.reservation = res or running.reservation, None
        if res is not None:
            self.cache.release(res)

    def abandon(self, exc: Exception, pending: list[Call[Any]]) -> list[Call[Any]]:
        """A runner's unexpected error ``exc``, said: every run the runner took and did not end
        (still tracked, or ended with its end never built) fails, retryable, with the error,
        and its memory and slot are freed; else the heartbeat would renew its lease for good.
        A run stopped or lost sends nothing (requeued, or no longer its). Returns the runner's
        unsent ends (``pending``) and these fails."""
        log.exception("worker.runner_error worker=%s", self.id)
        unsent = {(call.args[0], call.args[1]) for call in pending}
        tracked, ended = self.running.held_by(threading.get_ident())
        message = failure(exc)[0]
        calls = list(pending)
        for r in tracked:
            self.running.untrack(r)
            try:
                self.release(r)
            except Exception:  # the ledger's own fault: the task still ends
                log.exception("worker.release_failed worker=%s task=%s", self.id, r.task_id)
            if r.stopped:
                self.moot(r)
        for r in [*tracked, *(r for r in ended if (r.task_id, str(r.token)) not in unsent)]:
            if not (r.stopped or r.ctx.lost):
                log.warning("task.failed task=%s worker=%s retryable=True error=%s: its runner "
                            "failed", r.task_id, self.id, message)
                calls.append(self.calls.fail(r.task_id, r.token, message))
        return calls

    def moot(self, running: Running) -> None:
        """A run the worker stopped, its handler returned: counted "stopped" (requeued past
        its yield deadline) or "lost" (its lease gone: canceled, taken back), after its run
        phase; a newer run of the task on this worker (superseded) keeps the metrics label."""
        newer = any(r.task_id == running.task_id and r is not running for r in self.running.snapshot())
        self.observer.observe(running.task_id, running.stopped_as, keep=newer)

    def invoke(self, spec: HandlerSpec, runs: list[Running], *args: Any) -> Any:
        """Call the handler with ``args`` while ``runs`` (its task, or its batch's tasks)
        are marked inside it, so a stop reaches the handler and only the handler: StopTask
        in this thread, or for an async handler a cancel of its asyncio task, whose end
        (its unwinding included) this thread waits for. A handler's ``timeout_s`` starts
        here: its model's load is not counted. A handler that called ``yield_now`` gives way
        however it ends (Yielded): it may have caught its yield, and returned or raised."""
        aio = self.cache.aio.call() if spec.is_async else None
        if spec.timeout_s is not None:  # control fails and stops a call still running then
            until = time.monotonic() + spec.timeout_s
            for r in runs:
                r.run_deadline, r.timeout_s = until, spec.timeout_s
        for r in runs:
            r.enter(aio)
        try:
            if aio is not None:
                result = aio.run(spec.fn(*args))
            elif isinstance(result := spec.fn(*args), CoroutineType):  # inspect.iscoroutine, no call
                aio = self.cache.aio.call()  # an async def behind a plain decorator: awaited there
                for r in runs:
                    r.enter(aio)
                result = aio.run(result)
        except Yielded:
            raise
        except BaseException as exc:
            self.yield_caught(runs, exc)
            raise
        finally:
            for r in runs:
                r.leave()
        self.yield_caught(runs, None)
        return result

    def yield_caught(self, runs: list[Running], exc: BaseException | None) -> None:
        """Yielded if the handler called ``yield_now`` and then returned (``exc`` None) or
        raised something else: it gives way all the same."""
        for r in runs:
            if r.ctx.yielding:
                ids = ",".join(x.task_id for x in runs)
                if exc is not None:
                    log.warning("task.yield_caught task=%s worker=%s: the handler raised %s after "
                                "yield_now; it gives way all the same", ids, self.id, type(exc).__name__)
                raise Yielded(ids) from None

    def taken_up(self, fields: dict[str, str], res: Reservation, running: Running) -> bool:
        """The handler is about to start: a warm hand-over's began goes out without a wait
        (gpuq.worker.takeup) while it is in time (``in_time``), any other start's with one
        (``report_start``)."""
        cold = res.cold or res.waits  # waits: a load under way here came first all the same
        if in_time(running, cold) and self.takeups.send(fields, running):
            return True
        return self.report_start(fields, running, warm=not cold)

    def report_start(self, fields: dict[str, str], running: Running, *, warm: bool = False) -> bool:
        """A cold-started (or, ``warm``, handed-over) task's handler is about to start:
        began.lua decides its SLA now (one round trip). False when the lease is gone: another
        attempt owns the task, and this one's result would be rejected, so the handler is not
        run."""
        try:
            decided, now_ms = self.scripts.run(self.calls.began(running.task_id, running.token,
                                                                warm=warm))
        except (StaleLease, TaskNotFound):
            log.warning("lease.lost task=%s worker=%s: %s", running.task_id, self.id,
                        "taken back before it was taken up" if running.handed else "lost during its load")
            return False
        except redis.RedisError as exc:  # the handler runs, SLA uncounted; a warm hand-over's
            # does not: it may be taken back unanswered at its pickup deadline (or lease's end)
            log.warning("sla.unreported task=%s worker=%s error=%s", running.task_id, self.id, exc)
            return not running.handed
        if decided:
            self.observer.began(fields, now_ms)
        return True

    def send(self, calls: list[Call[Any]]) -> list[Any]:
        """The replies of settle calls sent in one round trip: after a warm hand-over's
        began on its connection while its reply is unread (gpuq.worker.takeup)."""
        replies = self.takeups.settle(calls)
        return self.scripts.pipelined(calls) if replies is None else replies

    def settle(self, call: Call[Any], reply: Any) -> None:
        """Check the reply of an ack, fail or yield; a stale token means another attempt
        owns the task. Never raises: the replies read after it (the claim sent with the
        ends among them) must still be read, and an end already sent must not be sent again."""
        try:
            self._settle(call, reply)
        except Exception:  # the reply read or counted wrong: said, its run no longer renewed
            log.exception("task.settle_failed task=%s worker=%s", call.args[0], self.id)

    def _settle(self, call: Call[Any], reply: Any) -> None:
        task_id = call.args[0]
        if call.args[1]:  # the run's lease is renewed no more (gpuq.worker.running)
            self.running.settled(task_id, int(call.args[1]))
        run = self.unacked.pop((task_id, call.args[1]), None) if call.script == "ack" else None
        try:
            done = call.parse(reply)
        except StaleLease:
            self.observer.observe(task_id, "lost")
            log.warning("lease.lost task=%s worker=%s: %s discarded", task_id, self.id,
                        "result" if call.script == "ack" else "failure")
        except GpuqError as exc:  # e.g. a result the server would not take: the lease runs out
            self.observer.observe(task_id, "lost")
            log.error("task.settle_failed task=%s worker=%s error=%s", task_id, self.id, exc)
        else:
            if self.observer.metrics is not None:
                self.observer.observe(task_id, SETTLED.get(call.script) or FAILED.get(done, "failed"))
            if run is not None:
                self.runtimes.add(*run)
