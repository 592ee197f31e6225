"""Commands on the pool's tenants: set, rm, list, require."""

from __future__ import annotations

import json

import click

from gpuq.cli.tasks import opened
from gpuq.redact import one_line
from gpuq.tenants import DEFAULT_WEIGHT, Tenant, read, remove_tenant, require_registered, set_tenant


@click.group()
def tenant() -> None:
    """Tenants: their share of each priority level, and their caps."""


@tenant.command("set")
@click.argument("name")
@click.option("--weight", type=float, default=None,
              help="Share of each level against the other tenants with work queued there "
                   "[default: as it was; 1 for a new tenant].")
@click.option("--max-gpus", type=int, default=None,
              help="Most GPUs its running tasks ask for: a task of --gpus N counts N, "
                   "tasks sharing a GPU (a batch's) one each (0: none run).")
@click.option("--max-vram-gb", type=float, default=None, help="Most VRAM (GB) its running tasks use.")
@click.pass_context
def set_(ctx: click.Context, name: str, weight: float | None, max_gpus: int | None,
         max_vram_gb: float | None) -> None:
    """Register a tenant or change it: a weight not given stays as it was; caps not given
    are removed."""
    Tenant(name, DEFAULT_WEIGHT if weight is None else weight, max_gpus, max_vram_gb)  # checked first
    with opened(ctx) as queue:
        if weight is None:  # as it was: a tenant not registered (or not readable) has the default
            was = queue.redis.hget(queue.keys.tenants, name)
            kept = Tenant.parse(name, str(was)) if was else None
            weight = kept.weight if kept else DEFAULT_WEIGHT
        t = Tenant(name, weight, max_gpus, max_vram_gb)
        before = set_tenant(queue, t)
    click.echo(one_line(f"{'changed' if before else 'registered'} {_line(t)}"))


@tenant.command("rm")
@click.argument("name")
@click.pass_context
def rm(ctx: click.Context, name: str) -> None:
    """Remove a tenant (its tasks stay; the last one ends tenant sharing)."""
    with opened(ctx) as queue:
        remove_tenant(queue, name)
    click.echo(f"removed {name}")


@tenant.command("require")
@click.argument("state", type=click.Choice(["on", "off"]))
@click.pass_context
def require(ctx: click.Context, state: str) -> None:
    """Whether enqueue refuses tasks of tenants not registered."""
    with opened(ctx) as queue:
        require_registered(queue, state == "on")
    click.echo(f"registered tenants {'required' if state == 'on' else 'not required'}")


@tenant.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """Tenants registered or with tasks queued: weight, caps, the reaper's bound (the running
    tasks it lets a tenant have while others' demand needs room), running use, queued tasks."""
    with opened(ctx) as queue:
        states, required = read(queue.redis, queue.keys)
    if as_json:
        click.echo(json.dumps({"required": required, "tenants": [s.to_dict() for s in states]},
                              indent=2))
        return
    click.echo(f"{'TENANT':<16}{'WEIGHT':>8}{'MAX GPUS':>10}{'MAX VRAM':>10}{'BOUND':>7}"
               f"{'RUNNING':>9}{'GPUS':>6}{'VRAM':>8}  QUEUED")
    for s in states:
        t = s.tenant
        name = t.name if s.registered else f"{t.name}*"
        queued = " ".join(f"{p}={n}" for p, n in sorted(s.queued.items())) or "-"
        # names are users' text: escaped, as status does, so no terminal escape gets through
        click.echo(one_line(f"{name:<16}{t.weight:>8g}{_cap(t.max_gpus):>10}{_cap(t.max_vram_gb):>10}"
                            f"{_cap(s.bound):>7}{_cap(s.running):>9}{_cap(s.running_gpus):>6}"
                            f"{_cap(s.running_vram_gb):>8}"
                            f"  {queued}"))
    if not all(s.registered for s in states):
        click.echo("* not registered: weight 1, no caps")
    if any(s.running is None for s in states):  # the claim counts use only where a limit needs it
        click.echo("RUNNING, GPUS, VRAM: counted for tenants with a cap or a bound only (-: not counted)")
    if required:
        click.echo("tasks of tenants not registered are refused")


def _cap(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _line(t: Tenant) -> str:
    return (f"{t.name}: weight {t.weight:g}, max_gpus {_cap(t.max_gpus)}, "
            f"max_vram_gb {_cap(t.max_vram_gb)}")


COMMANDS = (tenant,)
