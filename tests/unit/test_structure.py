"""The package's shape: imports point one way, modules stay small, tests mirror the package.

Every import counts, wherever it sits (module level, under TYPE_CHECKING, inside a
function): a function-local import hides a cycle from the interpreter, not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpuq"
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The gpuq modules this module imports; ``from gpuq.x import y`` names the submodule
    gpuq.x.y when y is one, else gpuq.x itself."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1 folders
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imported(name, path, known) for name, path in found.items()}


def components(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def cycle_in(edges: dict[str, set[str]], members: list[str]) -> list[str]:
    """One cycle through a component's first module, as a path that ends where it starts
    (breadth first: the shortest way back)."""
    inside = set(members)
    start = members[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(edges[node] & inside):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    raise AssertionError(f"no cycle in component {members}")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per tangle of modules that import each other."""
    return [cycle_in(edges, members) for members in components(edges)]


def test_cycles_are_found_one_per_component() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}}) == [
        ["a", "b", "c", "a"], ["d", "e", "d"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_imports_resolve_submodules_and_packages(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from gpuq import logs, Queue\n"  # a submodule; a name the package exports
        "from . import sibling\n"
        "if TYPE_CHECKING:\n"
        "    from gpuq.sub.deep import Thing\n"
        "def later():\n"
        "    import gpuq.other\n")
    known = {"gpuq", "gpuq.logs", "gpuq.sub", "gpuq.sub.deep", "gpuq.sub.sibling", "gpuq.other"}
    assert imported("gpuq.sub.mod", source, known) == {
        "gpuq.logs", "gpuq", "gpuq.sub.sibling", "gpuq.sub.deep", "gpuq.other"}


def test_no_import_cycle() -> None:
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_module_over_max_lines() -> None:
    files = [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.lua")]
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_unit_test_folders_mirror_the_package() -> None:
    unit = ROOT / "tests" / "unit"
    folders = {p.name for p in unit.iterdir() if p.is_dir() and p.name != "__pycache__"}
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders <= subpackages, f"not a subpackage of gpuq: {sorted(folders - subpackages)}"
