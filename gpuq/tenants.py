"""Tenants: who shares a pool, by what weight, within which caps.

Once a tenant is registered, each priority level is shared among the tenants with work queued
there in proportion to their weights (unregistered tenants weigh 1), and a capped tenant's
running tasks and their VRAM stay within its caps; the pool may also refuse tasks of tenants
not registered. The rules run inside the scripts (``gpuq/lua/lib/tenancy.lua``); this module
registers tenants (``tenant.lua``) and reads what the pool holds for them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis

from gpuq.calls import num_text
from gpuq.errors import BadTenant, TenantError
from gpuq.keys import REQUIRED, Keys
from gpuq.names import name_problem
from gpuq.scripts import Calls, Scripts

DEFAULT_WEIGHT = 1.0
BOUND = "bound:"  # tenant:use field prefix of the reaper's bounds (lib/quota.lua)


@dataclass(frozen=True)
class Tenant:
    name: str
    weight: float = DEFAULT_WEIGHT
    max_gpus: int | None = None  # GPUs its running tasks ask for (a gpus=N task: N, each its own)
    max_vram_gb: float | None = None  # their VRAM, weights included

    def __post_init__(self) -> None:
        if not self.name:
            raise BadTenant("tenant name must not be empty")
        if problem := name_problem(self.name):
            raise BadTenant(f"tenant name {problem}")
        if not (math.isfinite(self.weight) and 1e-6 <= self.weight <= 1e6):
            raise BadTenant(f"weight must be 1e-6..1e6, got {self.weight}")
        if self.max_gpus is not None and not 0 <= self.max_gpus <= 1_000_000:
            raise BadTenant(f"max_gpus must be 0..1000000, got {self.max_gpus}")
        if self.max_vram_gb is not None and not (math.isfinite(self.max_vram_gb)
                                                 and 0 <= self.max_vram_gb <= 1e9):
            raise BadTenant(f"max_vram_gb must be 0..1e9, got {self.max_vram_gb}")

    @property
    def capped(self) -> bool:
        return self.max_gpus is not None or self.max_vram_gb is not None

    def past_caps(self, gpus: int, vram_gb: float) -> str | None:
        """Why this tenant could never run a task of ``gpus`` GPUs and ``vram_gb`` GB under
        its caps (enqueue's words: lib/tenancy.lua's past_caps), or None."""
        if ((self.max_gpus is None or gpus <= self.max_gpus)
                and (self.max_vram_gb is None or vram_gb <= self.max_vram_gb + 1e-9)):
            return None
        # the script's words: the need as the client sends it, the caps as Lua prints numbers
        allow = (f"{'any' if self.max_gpus is None else self.max_gpus} GPUs and "
                 f"{'any' if self.max_vram_gb is None else f'{self.max_vram_gb:.14g}'} GB")
        return (f"tenant {self.name} could never run it: it needs {gpus} GPUs and {num_text(vram_gb)} GB, "
                f"the tenant's caps allow {allow} (gpuq tenant set)")

    @classmethod
    def from_spec(cls, spec: str) -> Tenant:
        """``NAME[:WEIGHT[:MAX_GPUS[:MAX_VRAM_GB]]]`` ("-" or nothing: the default, no cap),
        as ``gpuq simulate --tenant`` takes it."""
        name, *rest = spec.split(":")
        if len(rest) > 3:
            raise BadTenant(f"--tenant {spec!r}: NAME[:WEIGHT[:MAX_GPUS[:MAX_VRAM_GB]]]")
        weight, gpus, vram = (rest + ["", "", ""])[:3]
        try:
            return cls(name, float(weight) if weight not in ("", "-") else DEFAULT_WEIGHT,
                       int(gpus) if gpus not in ("", "-") else None,
                       float(vram) if vram not in ("", "-") else None)
        except ValueError:
            raise BadTenant(f"--tenant {spec!r}: weight and caps must be numbers") from None

    @classmethod
    def parse(cls, name: str, value: str) -> Tenant | None:
        """A ``tenants`` entry, "<weight> <max_gpus> <max_vram_gb>" ("-": no cap); None when
        malformed (the scripts then treat the tenant as unregistered)."""
        try:
            weight, gpus, vram = value.split(" ")
            return cls(name, float(weight), None if gpus == "-" else int(gpus),
                       None if vram == "-" else float(vram))
        except (ValueError, TenantError):
            return None


@dataclass
class TenantState:
    """A tenant as the pool sees it now."""

    tenant: Tenant
    registered: bool
    # limited tenants only (caps or bound): running tasks, the GPUs they ask for, their VRAM
    running: int | None = None
    running_gpus: int | None = None
    running_vram_gb: float | None = None
    queued: dict[str, int] = field(default_factory=dict)  # "P<n>" -> tasks queued
    bound: int | None = None  # the running tasks the reaper lets it have (gpuq.reaper.tenant_room)

    def to_dict(self) -> dict[str, Any]:
        t = self.tenant
        return {"name": t.name, "registered": self.registered, "weight": t.weight,
                "max_gpus": t.max_gpus, "max_vram_gb": t.max_vram_gb, "bound": self.bound,
                "running": self.running, "running_gpus": self.running_gpus,
                "running_vram_gb": self.running_vram_gb,
                "queued": self.queued}


class Scripted(Protocol):
    """What registering a tenant needs of a gpuq.Queue (not imported: gpuq.bulk, which the
    client imports, reads tenants' caps)."""

    @property
    def scripts(self) -> Scripts: ...

    @property
    def calls(self) -> Calls: ...


def set_tenant(queue: Scripted, tenant: Tenant) -> Tenant | None:
    """Register or change ``tenant`` (its caps bind its running tasks at once); its former
    setting, if any."""
    def cap(value: float | None) -> str:
        return "-" if value is None else repr(value)

    before = queue.scripts.run(queue.calls.tenant(
        "set", tenant.name, repr(tenant.weight), cap(tenant.max_gpus), cap(tenant.max_vram_gb)))
    return Tenant.parse(tenant.name, before) if before else None


def remove_tenant(queue: Scripted, name: str) -> None:
    """Remove a registered tenant (TenantError if it is not); the last one ends tenancy."""
    queue.scripts.run(queue.calls.tenant("remove", name))


def require_registered(queue: Scripted, on: bool) -> None:
    """Whether enqueue refuses tasks of tenants not registered."""
    queue.scripts.run(queue.calls.tenant("require", "1" if on else "0"))


def registered(registry: Mapping[str, str]) -> dict[str, Tenant]:
    """The well-formed tenants of a ``tenants`` hash, by name (its policy field left out)."""
    out = {}
    for name, value in registry.items():
        if name != REQUIRED and (t := Tenant.parse(name, value)) is not None:
            out[name] = t
    return out


def bounds_of(use: Mapping[str, str]) -> dict[str, int]:
    """The reaper's bounds in a ``tenant:use`` hash, by tenant (gpuq.reaper.tenant_room)."""
    return {k[len(BOUND):]: int(float(v)) for k, v in use.items() if k.startswith(BOUND)}


def read(client: redis.Redis, keys: Keys) -> tuple[list[TenantState], bool]:
    """Every registered tenant and every tenant with queued work counted or a bound, by
    name, and whether the pool requires registration."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.tenants)
    pipe.hgetall(keys.tenant_queued)
    pipe.hgetall(keys.tenant_use)
    registry, queued, use = pipe.execute()
    states = {name: TenantState(t, True) for name, t in registered(registry).items()}

    def state_of(name: str) -> TenantState | None:
        if name not in states:
            try:
                states[name] = TenantState(Tenant(name), False)
            except TenantError:
                return None
        return states[name]

    for key, count in queued.items():
        level, _, name = key.partition(":")
        if (state := state_of(name)) is not None and int(count) > 0:
            state.queued[f"P{level}"] = int(count)
    for name, bound in bounds_of(use).items():
        if (state := state_of(name)) is not None:
            state.bound = bound
    for state in states.values():
        if state.tenant.capped or state.bound is not None:
            gpus = int(float(use.get(f"gpus:{state.tenant.name}", 0)))
            # no task count: counted before GPUs were, when each task held one GPU
            state.running = int(float(use.get(f"tasks:{state.tenant.name}", gpus)))
            state.running_gpus = gpus
            state.running_vram_gb = round(float(use.get(f"vram:{state.tenant.name}", 0)), 3)
    return sorted(states.values(), key=lambda s: s.tenant.name), registry.get(REQUIRED) == "1"


def at_limit(states: Iterable[TenantState]) -> frozenset[str]:
    """The tenants whose running tasks are at a cap or at the reaper's bound: claims take none
    of their tasks until some end, so more GPUs would not start them (the scaler leaves their
    queued tasks out)."""
    out = set()
    for s in states:
        t = s.tenant
        if s.running is not None and (
                t.max_gpus is not None and (s.running_gpus or 0) >= t.max_gpus
                or t.max_vram_gb is not None and (s.running_vram_gb or 0.0) >= t.max_vram_gb
                or s.bound is not None and s.running >= s.bound):
            out.add(t.name)
    return frozenset(out)
