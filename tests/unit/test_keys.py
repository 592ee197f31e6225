"""gpuq.keys: one hash tag per pool, and no key literal anywhere else in the package."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import gpuq
from gpuq.keys import Keys, live_reservation

PACKAGE = Path(gpuq.__file__).parent


def all_keys(k: Keys) -> list[str]:
    """Every key name Keys can build (properties and one-argument builders)."""
    out = []
    for name, member in inspect.getmembers(type(k)):
        if name.startswith("_") or name == "pool" or name == "prefix":
            continue
        if isinstance(member, property):
            out.append(getattr(k, name))
        elif callable(member):
            params = list(inspect.signature(member).parameters)[1:]
            sample = {"priority": 2, "model": "llama3-8b", "task_id": "t1", "worker_id": "w1",
                      "rq_queue": "gpu"}
            out.append(getattr(k, name)(*(sample[p] for p in params)))
    return out


@pytest.mark.parametrize("prefix", ["gpuq", "ci"])
def test_every_key_carries_the_pool_hash_tag(prefix: str) -> None:
    k = Keys("default", prefix)
    keys = all_keys(k)
    assert len(keys) >= 20
    for key in keys:
        assert key.startswith(f"{prefix}:{{default}}:"), key
        assert key.count("{") == 1 and key.count("}") == 1, key  # one tag: the pool's


def test_keys_of_two_pools_differ() -> None:
    a, b = all_keys(Keys("a")), all_keys(Keys("b"))
    assert not set(a) & set(b)
    assert len(set(a)) == len(a), "two builders produce the same key"


def test_keys_of_different_names_differ() -> None:
    k = Keys("p")
    assert k.queue(0, "m") != k.queue(1, "m") != k.queue(0, "n")
    assert k.worker("w") != k.worker_tasks("w") != k.wake("w")
    assert k.task("x") != k.done("x")


def test_base_and_pattern() -> None:
    k = Keys("pool-1", "gpuq")
    assert k.base == "gpuq:{pool-1}:"
    assert k.pattern == k.base + "*"
    assert k.task("abc") == "gpuq:{pool-1}:task:abc"


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def key_literals(source: str) -> list[str]:
    """String pieces in code (not docstrings) that look like key building."""
    tree = ast.parse(source)
    docs = _docstring_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            pieces = [node.value]
        elif isinstance(node, ast.JoinedStr):  # its literal parts are Constants, walked too
            # f"{keys.base}task:{id}": a key built from the base outside keys.py
            if any(isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Attribute)
                   and v.value.attr == "base" for v in node.values) and len(node.values) > 1:
                found.append(ast.unparse(node))
            continue
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            sides = (node.left, node.right)
            if any(isinstance(s, ast.Attribute) and s.attr == "base" for s in sides) and any(
                    isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides):
                found.append(ast.unparse(node))
            continue
        else:
            continue
        for piece in pieces:
            if ":{" in piece or piece.startswith("gpuq:"):
                found.append(piece)
    return found


def test_the_detector_finds_key_building() -> None:
    bad = ('x = f"gpuq:{{{pool}}}:task:{tid}"\ny = "gpuq:{default}:running"\n'
           'z = keys.base + "task:" + tid\nw = f"{keys.base}q:{p}"\n')
    assert len(key_literals(bad)) == 4
    ok = '"""gpuq: docs mention gpuq:{pool}:"""\nu = f"redis://127.0.0.1:{port}/0"\n'
    assert key_literals(ok) == []


def test_no_other_module_builds_keys() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "keys.py" and path.parent == PACKAGE:
            continue
        found = key_literals(path.read_text())
        if found:
            offenders[str(path.relative_to(PACKAGE))] = found
    assert offenders == {}, "key names must be built in gpuq/keys.py only"


def test_a_reservation_is_live_until_its_expiry() -> None:
    assert live_reservation("t-1 1000", 999) == ("t-1", 1000)
    assert live_reservation(b"t-1 1000", 999) == ("t-1", 1000)
    assert live_reservation("t-1 1000", 1000) is None  # expired at its expiry
    for value in (None, "", "t-1", "t-1 soon", "t-1 -5"):
        assert live_reservation(value, 0) is None, value
