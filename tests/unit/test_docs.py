"""docs/RELIABILITY.md names real tests: every test file, test name and `-k` word its table
rows give resolves to a file under tests/ and a test defined in it.

A row names a file (`tests/unit/test_x.py`, or `test_x.py` alone), then its tests:
`file::test_name`, `::test_name` (the row's last file), a name cut with `...`
(`test_a_zero_result_ttl_...`, `..._escaped...`), or `-k word` in a command.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILE = re.compile(r"(?<![\w/*])((?:tests/[\w/]+/)?test_\w+\.py)(?!\*)")
NAME = re.compile(r"(?:::|(?<![\w.:/]))((?:\.\.\.)?(?:test_)?\w*(?:\.\.\.\w*)*)")


@cache
def defined(path: Path) -> set[str]:
    return set(re.findall(r"^\s*(?:async\s+)?def (test_\w+)", path.read_text(), re.M))


def files_by_name() -> dict[str, list[Path]]:
    """Each test file under tests/ by its path from the root and by its name alone."""
    found: dict[str, list[Path]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        found.setdefault(str(path.relative_to(ROOT)), []).append(path)
        found.setdefault(path.name, []).append(path)
    return found


def matches(name: str, tests: set[str]) -> bool:
    pattern = ".*".join(map(re.escape, name.split("...")))
    return any(re.fullmatch(pattern, test) for test in tests)


def unresolved(row: str, files: dict[str, list[Path]]) -> list[str]:
    """What a table row names that no test file or test defines."""
    missing: list[str] = []
    current: list[Path] = []  # the files the row named last: its bare names are theirs
    for span in re.findall(r"`([^`]*)`", row):
        for file in FILE.findall(span):
            current = files.get(file, [])
            if not current:
                missing.append(file)
        tests = set().union(*map(defined, current)) if current else set()
        if (word := re.search(r"(?<!\S)-k (\w+)", span)) is not None:
            if not any(word.group(1) in test for test in tests):
                missing.append(f"-k {word.group(1)} in {[p.name for p in current]}")
            continue
        for name in NAME.findall(FILE.sub("", span)):
            if name.startswith(("test_", "...")) and name.strip(".") and "_" in name:
                everywhere = tests or set().union(*(defined(p) for ps in files.values() for p in ps))
                if not matches(name, everywhere):
                    missing.append(name)
    return missing


def test_unresolved_names_what_no_test_defines(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text("def test_one_thing():\n    pass\n")
    files = {"test_a.py": [tmp_path / "test_a.py"]}
    good = "| x | y | `test_a.py::test_one_thing`, `::test_one_...`, `..._thing`, `pytest test_a.py -k one` |"
    assert unresolved(good, files) == []
    bad = "| x | y | `test_a.py::test_two_things`, `test_b.py`, `pytest test_a.py -k two` |"
    assert unresolved(bad, files) == ["test_two_things", "test_b.py", "-k two in ['test_a.py']"]


def test_reliability_rows_name_tests_that_exist() -> None:
    files = files_by_name()
    rows = [line for line in (ROOT / "docs" / "RELIABILITY.md").read_text().splitlines()
            if line.startswith("|")]
    missing = {row[:60]: found for row in rows if (found := unresolved(row, files))}
    assert not missing, f"docs/RELIABILITY.md names tests that do not exist: {missing}"
