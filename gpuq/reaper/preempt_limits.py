"""Tenants' limits in the preemption plan (gpuq.reaper.preempt).

A claim passes over a task whose start would take its tenant past a cap or its bound
(lua/lib/quota.lua), so a GPU freed for a waiting task of a tenant at its limit stays
unused by it: another tenant's victim would yield for nothing. For such a task only the end
of one of its own tenant's running tasks that gives back enough of the limit makes room;
the plan asks nothing of the others. Limits are read once a step for the waiting tasks'
tenants, with the same rule the claim applies; the plan counts the starts it decides, so
two waiting tasks of one tenant do not both count on the same room.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import redis

from gpuq.keys import Keys
from gpuq.tenants import Tenant
from gpuq.worker_record import field_number

Charge = tuple[str, float, int]  # a running task's tenant, VRAM and GPUs counted against its limits


@dataclass(frozen=True)
class Limits:
    """A limited tenant's caps, bound and running use (tenant_use), as quota.lua reads them."""

    max_gpus: int | None = None
    max_vram_gb: float | None = None
    bound: float | None = None  # running tasks the tenants' room step lets it have
    gpus: float = 0.0
    vram_gb: float = 0.0
    tasks: float = 0.0

    def over(self, vram_gb: float, gpus: int) -> bool:
        """Whether starting a task of vram_gb across gpus would take the tenant past a limit."""
        return (self.max_gpus is not None and self.gpus + gpus > self.max_gpus
                or self.bound is not None and self.tasks + 1 > self.bound
                or self.max_vram_gb is not None and self.vram_gb + vram_gb > self.max_vram_gb + 1e-9)

    def after(self, charge: Charge | None = None, start: tuple[float, int] | None = None) -> Limits:
        """The use once ``charge`` (a task of this tenant) ends and ``start`` (vram, gpus) starts."""
        gpus, vram, tasks = self.gpus, self.vram_gb, self.tasks
        if charge is not None:
            gpus, vram, tasks = gpus - charge[2], vram - charge[1], tasks - 1
        if start is not None:
            gpus, vram, tasks = gpus + start[1], vram + start[0], tasks + 1
        return replace(self, gpus=gpus, vram_gb=vram, tasks=tasks)


def charge_of(value: str | None) -> Charge | None:
    """A task's `charged` field, "<tenant> <vram_gb>[ <gpus>]"; None when absent or malformed."""
    parts = (value or "").split(" ")
    if len(parts) not in (2, 3) or not parts[0]:
        return None
    try:
        return parts[0], float(parts[1]), int(parts[2]) if len(parts) == 3 else 1
    except ValueError:
        return None


def read_limits(client: redis.Redis, keys: Keys, tenants: Iterable[str]) -> dict[str, Limits]:
    """The limited tenants among ``tenants`` (none while tenancy is off: no `tenants` hash),
    one round trip."""
    names = sorted(set(tenants))
    if not names:
        return {}
    pipe = client.pipeline(transaction=False)
    pipe.exists(keys.tenants)
    pipe.hmget(keys.tenants, names)
    for t in names:
        pipe.hmget(keys.tenant_use, f"gpus:{t}", f"vram:{t}", f"bound:{t}", f"tasks:{t}")
    on, terms, *uses = pipe.execute()
    if not on:
        return {}
    out: dict[str, Limits] = {}
    for t, value, (gpus, vram, bound, tasks) in zip(names, terms, uses):
        tenant = Tenant.parse(t, value) if value else None
        caps = (tenant.max_gpus, tenant.max_vram_gb) if tenant else (None, None)
        limit = field_number(bound) if bound is not None else None
        if caps == (None, None) and limit is None:
            continue
        used_gpus = field_number(gpus)
        out[t] = Limits(caps[0], caps[1], limit, used_gpus, field_number(vram),
                        field_number(tasks) if tasks is not None else used_gpus)
    return out
