"""Commands on the pool's periodic tasks: schedule add, list, remove."""

from __future__ import annotations

import json
from typing import Any

import click

from gpuq import schedule as schedules
from gpuq.cli.tasks import opened, spec_options
from gpuq.clock import server_ms
from gpuq.redact import one_line
from gpuq.task import parse_payload_text


@click.group()
def schedule() -> None:
    """Periodic tasks: a task enqueued every interval or on a cron expression (UTC)."""


@click.command("HANDLER")
@click.argument("handler")
@spec_options
def _run_spec(**given: Any) -> dict[str, Any]:
    """The task of a schedule's runs (parsed from what follows the schedule's options)."""
    return given


@schedule.command("add", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.option("--every", default=None, help="Interval: 90s, 10m, 1.5h, 2d (at least 1 s), "
              "counted from now.")
@click.option("--cron", default=None, help='Five-field cron expression in UTC, e.g. "0 3 * * *".')
@click.option("--skip-missed", is_flag=True,
              help="A run more than a minute late (no reaper ran) is skipped, not enqueued once.")
@click.argument("task", nargs=-1, type=click.UNPROCESSED, metavar="-- HANDLER [TASK OPTIONS]")
@click.pass_context
def add(ctx: click.Context, /, name: str, every: str | None, cron: str | None, skip_missed: bool,
        task: tuple[str, ...]) -> None:
    """Add schedule NAME: its runs are tasks of HANDLER with the options of gpuq enqueue
    (--payload, --model, --vram-gb, --priority, --est-s, --deadline-s, --tenant,
    --no-preempt, --max-attempts, --gpus)."""
    given: dict[str, Any] = _run_spec.main(list(task), prog_name="gpuq schedule add NAME --",
                                           standalone_mode=False)
    if not isinstance(given, dict):  # --help of the task part: printed already
        return
    payload, no_preempt = given.pop("payload"), given.pop("no_preempt")
    with opened(ctx) as queue:
        s = schedules.add(queue.redis, queue.keys, name, given.pop("handler"),
                          parse_payload_text(payload), every=every, cron=cron,
                          skip_missed=skip_missed, preemptible=not no_preempt, url=queue.url, **given)
    nxt = s.next_ms(s.anchor_ms)
    click.echo(f"added {name}: first run at {nxt / 1000 if nxt else 'never'} (epoch s)")


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """Every schedule: its interval or cron, last and next period (epoch s), its task."""
    with opened(ctx) as queue:
        now = server_ms(queue.redis)
        found = [s.to_dict(now) for s in schedules.list_schedules(queue.redis, queue.keys, url=queue.url)]
    if as_json:  # the payload as JSON, as `gpuq task --json` shows a task's (stored as its text)
        shown = [{**d, "task": {**d["task"], "payload": _json_or_text(d["task"].get("payload"))}}
                 for d in found]
        click.echo(json.dumps(shown, indent=2))
        return
    if not found:
        click.echo("(no schedules)")
    for d in found:
        when = f"every {_every(d['every_s'])}" if d["every_s"] else f"cron {d['cron']!r}"
        t = d["task"]
        click.echo(one_line(f"{d['name']}: {when}{' skip-missed' if d['skip_missed'] else ''}, "
                            f"last {d['last_period'] or '-'}, next {d['next_period']}: {t['handler']} "
                            f"model={t['model']} P{t['priority']}"))


def _every(seconds: float) -> str:
    """An interval as `--every` takes it: its largest whole unit (3600 -> 1h, 90 -> 90s)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _json_or_text(text: Any) -> Any:
    """A stored payload's value; its text where it was damaged by hand."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


@schedule.command("remove")
@click.argument("name")
@click.pass_context
def remove(ctx: click.Context, name: str) -> None:
    """Remove a schedule (runs already enqueued stay)."""
    with opened(ctx) as queue:
        schedules.remove(queue.redis, queue.keys, name, url=queue.url)
    click.echo(f"removed {name}")


COMMANDS = (schedule,)
