"""Commands on one task or one worker: enqueue, task, cancel, requeue, drain; and failures,
the tasks that ended failed lately."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import click

from gpuq.cli.base import PRIORITY_HELP, an_id, no_preempt_option, open_queue, task_option
from gpuq.client import Queue
from gpuq.connection import redis_errors
from gpuq.errors import ConfigError
from gpuq.keys import FAILURES_KEPT
from gpuq.redact import one_line
from gpuq.task import parse_payload_text
from gpuq.views.inspect import number, recent_failures, task_children

F = TypeVar("F", bound=Callable[..., Any])
Check = Callable[[click.Context, click.Parameter, Any], Any]


def within(rule: str, ok: Callable[[float], bool]) -> Check:
    """An option callback refusing, in one line, a given number ``ok`` rejects. Write ``ok``
    as what a good value is (``t >= 0``): nan then fails it, as it fails every comparison
    (click's ranges let it through)."""

    def check(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
        if value is not None and not ok(value):
            raise ConfigError(f"{param.opts[0]} must be {rule}, got {value}")
        return value

    return check


@contextmanager
def opened(ctx: click.Context) -> Iterator[Queue]:
    """The pool's queue for a command's Redis work: a refusal (ACL, read-only replica) is one
    line, and the client is closed at the end, not left to the collector by a traceback."""
    queue = open_queue(ctx)
    try:
        with redis_errors(queue.url):
            yield queue
    finally:
        queue.close()


def spec_options(command: F) -> F:
    """The options of a task's spec, shared by ``enqueue`` and ``schedule add``."""
    for option in reversed((
            click.option("--payload", default="null", help="JSON payload.", show_default=True),
            task_option("model", "Model the task runs on."),
            task_option("vram_gb", "VRAM the task needs (GB), weights included."),
            task_option("priority", PRIORITY_HELP),
            task_option("est_s", "Estimated run seconds (default: the mean the pool learned from "
                        "this handler and model's successful runs, else 1)."),
            task_option("deadline_s", "Seconds from now (from its due time when delayed) the "
                        "task must end by: one shorter than --est-s is refused; one that can no "
                        "longer make it is expired before it starts; a running one is not "
                        "stopped at it."),
            task_option("tenant", None),
            no_preempt_option("Never preempt this task."),
            task_option("max_attempts", None),
            task_option("gpus", "GPUs the task runs across (tensor parallel); --vram-gb is its "
                        "need over all of them."))):
        command = option(command)
    return command


@click.command()
@click.argument("handler")
@spec_options
@task_option("delay_s", "Queue it this many seconds from now (server clock).")
@task_option("at", "Queue it at this epoch time (seconds; not past).")
@click.option("--after", "after", multiple=True, metavar="ID",
              help="Queue it once this task succeeded (repeatable: every one).")
@click.option("--after-any-outcome", is_flag=True,
              help="With --after: queue it once every parent ended, however it ended.")
@click.option("--check-fit", is_flag=True,
              help="Reject the task if no registered GPU class fits it or no worker registers its handler.")
@click.option("--wait", is_flag=True, help="Wait for the result and print it.")
@click.option("--stream", is_flag=True,
              help="Print each chunk the handler emits (JSON, one a line) as it comes, then the "
                   "result, as --wait does; a new run's restart is noted on stderr.")
@click.option("--timeout", type=float, default=None,
              callback=within("a number of seconds >= 0 (inf: no limit)", lambda t: t >= 0),
              help="With --wait or --stream: seconds to wait in all.")
@click.pass_context
def enqueue(ctx: click.Context, /, handler: str, payload: str, no_preempt: bool, check_fit: bool,
            wait: bool, stream: bool, timeout: float | None, **options: Any) -> None:
    """Enqueue a task; print its id (or its result with --wait, its chunks then its result
    with --stream)."""
    if timeout is not None and not (wait or stream):  # it would be ignored: say so
        raise click.UsageError("--timeout needs --wait or --stream", ctx)
    if wait and stream:
        raise click.UsageError("give one of --wait and --stream (--stream prints the result last)", ctx)
    if options.get("after_any_outcome") and not options.get("after"):
        raise click.UsageError("--after-any-outcome needs --after", ctx)
    data = parse_payload_text(payload)
    queue = open_queue(ctx)
    task = queue.enqueue(handler, data, preemptible=not no_preempt, check_fit=check_fit, **options)
    if not (wait or stream):
        click.echo(task.id)
        return
    try:
        if stream:
            started = time.monotonic()
            for chunk in task.stream(timeout):
                if chunk.restart:
                    click.echo(f"(attempt {chunk.attempt} restarts the stream)", err=True)
                click.echo(json.dumps(chunk.data))
            timeout = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        click.echo(json.dumps(task.result(timeout)))
    except KeyboardInterrupt:  # the wait ends, not the task: say which task it was
        click.echo(f"Interrupted: task {task.id} goes on (gpuq task {task.id}; gpuq cancel {task.id})",
                   err=True)
        ctx.exit(130)


def verb(name: str, argument: str, act: Callable[[Queue, str], Any], said: str,
         help: str) -> click.Command:
    """A command that applies one Queue method to the id it is given and says what it did
    (``said`` names ``{id}`` and ``{state}``: what the method returned)."""

    @click.command(name, help=help)
    @click.argument(argument, type=an_id)
    @click.pass_context
    def command(ctx: click.Context, /, **given: str) -> None:
        subject = given[argument]
        state = act(open_queue(ctx), subject)
        click.echo(said.format(id=subject, state=getattr(state, "value", state)))

    return command


drain = verb("drain", "worker_id", Queue.drain_worker, "draining {id}",
             "Tell a worker to finish its running tasks, take no more, and exit.")
requeue = verb("requeue", "task_id", Queue.requeue, "requeued {id} ({state})",
               "Put a task back in its queue (running, waiting to retry, failed, expired or canceled).")
cancel = verb("cancel", "task_id", Queue.cancel, "canceled {id} (was {state})",
              "Cancel a queued, delayed, waiting or running task.")


@click.command()
@click.argument("task_id", type=an_id)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def task(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Every field of one task (timestamps as epoch seconds)."""
    with opened(ctx) as queue:  # the reads after the record's are plain commands
        record = queue.record(task_id).to_dict()
        record["children"] = task_children(queue.redis, queue.keys, task_id)
        pipe = queue.redis.pipeline(transaction=False)
        pipe.zscore(queue.keys.parked, task_id)
        pipe.zscore(queue.keys.handed, task_id)
        parked, pickup_ms = pipe.execute()
    # queued but out of its queue: no live worker can hold it (lua/park.lua)
    record["parked"] = parked is not None
    # handed over at enqueue, its worker's pickup not seen yet: taken back at this deadline
    # (epoch s) if still unread on its wake list; the set keeps a task that ended or went
    # back to a queue until the next claim or reap round tidies it (lib/due.lua)
    running = pickup_ms is not None and record["state"] == "running"
    record["pickup_by"] = pickup_ms / 1000 if running else None
    if as_json:
        click.echo(json.dumps(record, indent=2))
        return
    for key, value in record.items():
        shown = json.dumps(value) if isinstance(value, (dict, list)) else value
        # names and errors are producers' text: no terminal escape reaches the operator's screen
        click.echo(one_line(f"{key:<13} {'' if value is None else shown}"))


@click.command()
@click.option("--limit", type=click.IntRange(1, FAILURES_KEPT), default=20, show_default=True,
              help=f"Show this many, newest first (the pool keeps the last {FAILURES_KEPT}).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list.")
@click.pass_context
def failures(ctx: click.Context, limit: int, as_json: bool) -> None:
    """The tasks that ended failed lately, newest first: id, handler, model, priority, tenant,
    attempts and the error's start (the whole task: gpuq task ID, while it is kept)."""
    with opened(ctx) as queue:
        entries = recent_failures(queue.redis, queue.keys, limit)
    if as_json:
        click.echo(json.dumps(entries, indent=2))
        return
    if not entries:
        click.echo("(no failed tasks recorded)")
        return
    click.echo(f"{'FAILED AT (UTC)':<21}{'PRI':<5}{'TASK':<34}{'HANDLER':<20}{'MODEL':<20}"
               f"{'TENANT':<12}{'TRY':>4}  ERROR")
    for e in entries:
        at = number(e.get("at"))
        when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S") if (
            at is not None and 0 <= at < 1e11) else "?"
        text = [str(e.get(k) if e.get(k) is not None else "") for k in (
            "priority", "id", "handler", "model", "tenant", "attempt", "error")]
        pri, tid, handler, model, tenant, attempt, error = text
        # stored text is producers' and handlers' own: no terminal escape reaches the screen
        click.echo(one_line(f"{when:<21}{pri[:4]:<5}{tid[:33]:<34}{handler[:19]:<20}{model[:19]:<20}"
                            f"{tenant[:11]:<12}{attempt[:4]:>4}  {error}"))


COMMANDS = (enqueue, task, cancel, requeue, drain, failures)
