"""gpuq.keys: one hash tag per pool, and no key literal anywhere else in the package, its
Lua scripts included: their key names are generated from the same table."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from pathlib import Path

import fakeredis
import pytest

import gpuq
from gpuq.keys import FAILURES_KEPT, MISSES_KEPT, SUFFIXES, Keys, live_reservation, suffix_parts
from gpuq.lua_source import key_prelude, lua_name

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
            out.append(getattr(k, name)(*(SAMPLE[p] for p in params)))
    return out


SAMPLE = {"priority": 2, "level": 2, "model": "llama3-8b", "task_id": "t1", "worker_id": "w1",
          "rq_queue": "gpu", "bucket": 30_000_000}


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


def offenders(pattern: str, detect: Callable[[str], list[str]]) -> dict[str, list[str]]:
    """The package's files matching ``pattern`` in which ``detect`` finds key building."""
    found = {str(p.relative_to(PACKAGE)): detect(p.read_text()) for p in sorted(PACKAGE.rglob(pattern))}
    return {path: pieces for path, pieces in found.items() if pieces and path != "keys.py"}


def test_no_other_module_builds_keys() -> None:
    assert offenders("*.py", key_literals) == {}, "key names must be built in gpuq/keys.py only"


def test_a_reservation_is_live_until_its_expiry() -> None:
    assert live_reservation("t-1 1000", 999) == ("t-1", 1000)
    assert live_reservation(b"t-1 1000", 999) == ("t-1", 1000)
    assert live_reservation("t-1 1000", 1000) is None  # expired at its expiry
    for value in (None, "", "t-1", "t-1 soon", "t-1 -5"):
        assert live_reservation(value, 0) is None, value


def test_keys_builds_every_suffix_and_nothing_else() -> None:
    members = {n for n, _ in inspect.getmembers(Keys) if not n.startswith("_")}
    assert members - {"pool", "prefix", "base", "pattern"} == set(SUFFIXES)


def test_suffixes_are_plain_text_lua_can_quote() -> None:
    for name in SUFFIXES:
        for text, arg in suffix_parts(name):
            assert re.fullmatch(r"[a-z_:]*", text), name
            assert arg is None or arg in SAMPLE, name


@pytest.mark.parametrize("prefix", ["gpuq", "ci"])
def test_every_lua_key_name_is_the_python_key(prefix: str) -> None:
    """Each generated Lua name, run on a server for sample arguments, builds the same key as
    Keys (a priority comes in as a number, as the scripts pass it)."""
    k = Keys("default", prefix)
    lua, want = [], []
    for name in SUFFIXES:
        args = [a for _, a in suffix_parts(name) if a]
        if args:
            lua.append(f"{lua_name(name)}({', '.join(repr(SAMPLE[a]) for a in args)})")
            want.append(getattr(k, name)(*(SAMPLE[a] for a in args)))
        else:
            lua.append(lua_name(name))
            want.append(getattr(k, name))
    body = f"return {{{', '.join(lua)}}}"
    got = fakeredis.FakeRedis(decode_responses=True).eval(key_prelude(body) + body, 1, k.base)
    assert got == want


def lua_key_building(source: str) -> list[str]:
    """Key building in Lua code (not comments): the base (B, KEYS) or a suffix's text quoted."""
    code = re.sub(r"--[^\n]*", "", source)
    builders = [suffix_parts(n) for n in SUFFIXES if any(arg for _, arg in suffix_parts(n))]
    pieces = {text for parts in builders for text, _ in parts if len(text) > 1}  # 'task:', ':tasks'...
    found = re.findall(r"\bB\b|\bKEYS\b", code)
    return found + [q for q in re.findall(r"'([^']*)'|\"([^\"]*)\"", code) for q in q if q in pieces]


def test_the_lua_detector_finds_key_building() -> None:
    bad = "local k = B .. 'running'\nlocal w = 'worker:' .. w .. ':tasks'\nlocal x = KEYS[1]\n"
    assert len(lua_key_building(bad)) == 4
    ok = "-- B .. 'task:' in a comment\nlocal state = 'running'\nlocal t = task_key(id)\n"
    assert lua_key_building(ok) == []


def test_no_lua_file_builds_keys() -> None:
    assert offenders("*.lua", lua_key_building) == {}, "Lua key names come from gpuq/keys.py"


def test_the_lua_trims_failures_to_the_python_constant() -> None:
    lua = (PACKAGE / "lua" / "lib" / "failures.lua").read_text()
    kept = re.search(r"'LTRIM', K_FAILURES, 0, (\d+)\)", lua)
    assert kept is not None and int(kept.group(1)) == FAILURES_KEPT - 1


def test_the_lua_trims_misses_to_the_python_constant() -> None:
    lua = (PACKAGE / "lua" / "lib" / "start.lua").read_text()
    kept = re.search(r"'LTRIM', K_SLA_MISSES, 0, (\d+)\)", lua)
    assert kept is not None and int(kept.group(1)) == MISSES_KEPT - 1
