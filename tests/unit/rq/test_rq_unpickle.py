"""gpuq.rq.unpickle: a forged pickle names a global outside the allowlist and runs nothing."""

from __future__ import annotations

import datetime
import os
import pickle
from collections import OrderedDict
from pathlib import Path

import pytest

from gpuq.rq.unpickle import Allowlist, ForbiddenGlobal, RestrictedSerializer, restricted_loads

ALLOW = Allowlist(["gpuq.rq.context"])  # an importable module that imports names from others


class Touch:
    """Unpickling it with pickle.loads would create the file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.path}",)


def test_plain_data_and_harmless_value_types_load() -> None:
    value = {"a": [1, 2.5, "x", b"y", None, True], "s": {1, 2}, "f": frozenset({3}),
             "t": (datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC), datetime.timedelta(1)),
             "o": OrderedDict(k=1)}
    assert restricted_loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), ALLOW) == value


def test_a_forged_pickle_naming_os_system_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    data = pickle.dumps(("gpuq.rq.context.current_model", None, (Touch(marker), 1), {}))
    with pytest.raises(ForbiddenGlobal, match="system"):
        restricted_loads(data, ALLOW)
    assert not marker.exists()


@pytest.mark.parametrize("forged", [
    b"cbuiltins\neval\n(S'1'\ntR.",  # eval is a builtin, not a value type
    b"cgpuq.rq.context\nthreading.Thread\n.",  # a dotted name walks out of an allowed module
    b"cgpuq.rq.context\nContext\n.",  # found in an allowed module, but defined in gpuq.app
    b"cgpuq.rq.contextx\nRqContext\n.",  # a prefix counts on dot boundaries only
])
def test_globals_outside_the_allowlist_are_refused(forged: bytes) -> None:
    with pytest.raises(ForbiddenGlobal):
        restricted_loads(forged, ALLOW)


def test_allowed_module_globals_load() -> None:
    from gpuq.rq.context import RqContext, current_model

    assert restricted_loads(pickle.dumps(current_model), ALLOW) is current_model
    assert restricted_loads(pickle.dumps(RqContext), Allowlist(["gpuq.rq"])) is RqContext
    with pytest.raises(ForbiddenGlobal):
        restricted_loads(pickle.dumps(current_model), Allowlist([]))


def test_allowlist_matches_module_prefixes_on_dot_boundaries() -> None:
    allow = Allowlist([" myapp.jobs. ", ""])
    assert allow.modules == ("myapp.jobs",)
    assert allow.admits("myapp.jobs") and allow.admits("myapp.jobs.gpu.run")
    assert not allow.admits("myapp.jobsx") and not allow.admits("myapp")
    assert not Allowlist([]) and Allowlist(["x"])


def test_serializer_writes_what_rq_default_pickle_reads() -> None:
    serializer = RestrictedSerializer(ALLOW)
    assert pickle.loads(serializer.dumps({"v": 1})) == {"v": 1}
    assert serializer.loads(serializer.dumps([1, "a"])) == [1, "a"]
