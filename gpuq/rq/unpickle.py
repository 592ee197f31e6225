"""A pickle reader that cannot run code: only allowlisted modules and harmless builtins.

RQ stores a job's function call (and its meta) as a pickle, and ``pickle.loads`` imports and
calls whatever the data names, so whoever can write to RQ's Redis could run code on a worker.
``RestrictedUnpickler.find_class`` admits only the modules a worker allows (``--rq-allow``) plus
a few value types below; anything else (``os.system``, ``builtins.eval``, ``subprocess.Popen``)
raises ``ForbiddenGlobal`` before it is imported.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable
from typing import Any

from gpuq.errors import GpuqError

# value types that construct data and nothing else (no import, no call of user input)
SAFE_GLOBALS: frozenset[tuple[str, str]] = frozenset({
    ("builtins", name) for name in ("set", "frozenset", "complex", "bytearray", "slice", "range")
} | {
    ("datetime", name) for name in ("date", "datetime", "time", "timedelta", "timezone")
} | {("decimal", "Decimal"), ("uuid", "UUID"), ("collections", "OrderedDict"),
     ("collections", "deque")})


class ForbiddenGlobal(GpuqError):
    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name
        super().__init__(f"pickle names {module}.{name}, which is not in the worker's rq allowlist")


class Allowlist:
    """Module prefixes on dot boundaries: ``myapp.jobs`` allows ``myapp.jobs`` and
    ``myapp.jobs.gpu``, not ``myapp.jobsx`` or ``myapp``."""

    def __init__(self, modules: Iterable[str]) -> None:
        self.modules = tuple(sorted({m.strip().strip(".") for m in modules if m.strip().strip(".")}))

    def __bool__(self) -> bool:
        return bool(self.modules)

    def __repr__(self) -> str:
        return f"Allowlist({list(self.modules)!r})"

    def admits(self, dotted: str) -> bool:
        return any(dotted == m or dotted.startswith(m + ".") for m in self.modules)


class RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, allow: Allowlist) -> None:
        super().__init__(io.BytesIO(data))
        self.allow = allow

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in SAFE_GLOBALS:
            return super().find_class(module, name)
        # a dotted name walks attributes (``allowed_module.os.system``): refuse it outright,
        # and check that what an allowed module hands out was defined there
        if "." in name or not self.allow.admits(module):
            raise ForbiddenGlobal(module, name)
        found = super().find_class(module, name)
        if not self.allow.admits(getattr(found, "__module__", None) or ""):
            raise ForbiddenGlobal(module, name)
        return found


def restricted_loads(data: bytes, allow: Allowlist) -> Any:
    return RestrictedUnpickler(data, allow).load()


class RestrictedSerializer:
    """RQ's serializer protocol (``dumps`` / ``loads``): writes as RQ's default pickle
    serializer does, reads only what ``allow`` admits."""

    def __init__(self, allow: Allowlist) -> None:
        self.allow = allow

    def dumps(self, obj: Any) -> bytes:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)

    def loads(self, data: bytes) -> Any:
        return restricted_loads(data, self.allow)
