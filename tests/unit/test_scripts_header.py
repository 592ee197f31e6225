"""The Lua scripts' headers agree with gpuq.scripts: codes, KEYS/ARGV/Returns, sources."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from gpuq.scripts import SCRIPT_NAMES, Code, header_codes, lib_helpers, script_source, used_helpers

LUA = resources.files("gpuq") / "lua"


def lua_text(name: str) -> str:
    return (LUA / f"{name}.lua").read_text()


def header(name: str) -> str:
    """The leading comment block of a Lua file."""
    lines = []
    for line in lua_text(name).splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


def test_every_lua_file_is_a_known_script() -> None:
    files = {p.name[:-4] for p in LUA.iterdir() if p.name.endswith(".lua")}
    assert files == {*SCRIPT_NAMES, "_lib"}


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_header_documents_keys_argv_and_returns(name: str) -> None:
    text = header(name)
    assert text.startswith(f"-- {name}.lua: "), "a header opens with the file name and its job"
    for word in ("KEYS[1]", "ARGV[1]", "Returns"):
        assert word in text, f"{name}.lua header lacks {word}"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_header_codes_exist_in_code_enum(name: str) -> None:
    names = {c.name for c in Code}
    assert header_codes(name) <= names
    # Broader than header_codes' fixed list: any UPPER_CASE word after a reply in "Returns".
    returns = header(name).split("Returns", 1)[1]
    for number, code_name in re.findall(r"\{(\d+)[^}]*\}\s*:?\s*([A-Z][A-Z_]{2,})\b", returns):
        assert code_name in names, f"{name}.lua promises code {code_name}, missing from Code"
        assert Code[code_name] == int(number), f"{name}.lua: {code_name} is not {number}"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_reply_numbers_in_header_are_codes(name: str) -> None:
    returns = header(name).split("Returns", 1)[1]
    for number in re.findall(r"\{(\d+)", returns):
        assert int(number) in {int(c) for c in Code}


def test_lib_header_code_table_matches_enum() -> None:
    text = header("_lib")
    table = dict(re.findall(r"(\d+) ([A-Z][A-Z_]+)", text))
    assert table == {str(int(c)): c.name for c in Code}


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_script_source_is_lib_helpers_then_file_unchanged(name: str) -> None:
    """Scripts are loaded from their files as they are (no Python value is pasted in), after
    _lib.lua's head and the helpers they use, each as it is written there."""
    source = script_source(name)
    assert source.endswith("\n" + lua_text(name))
    head, helpers = lib_helpers(lua_text("_lib"))
    lib_part = source[: -len(lua_text(name)) - 1]
    assert lib_part.startswith(head)
    assert lib_part[len(head):] == "".join(helpers[h] for h in used_helpers(lua_text(name), helpers))


def test_the_helpers_a_script_needs_are_all_there() -> None:
    """A helper a kept helper calls is kept too; one nothing calls is left out."""
    head, helpers = lib_helpers(lua_text("_lib"))
    assert "".join([head, *helpers.values()]) == lua_text("_lib")  # the split loses nothing
    ack = used_helpers(lua_text("ack"), helpers)
    assert {"finish", "release", "task_key", "is_json", "clock"} <= set(ack)
    assert "push" not in ack and "wake" not in ack
    reap = used_helpers(lua_text("reap"), helpers)
    assert {"requeue", "push", "index", "wake", "idle_holder", "serves"} <= set(reap)  # transitively
    assert used_helpers(lua_text("lead"), helpers) == []


@pytest.mark.parametrize("name", ["_lib", *SCRIPT_NAMES])
def test_lua_has_no_templating_placeholders(name: str) -> None:
    code = re.sub(r"--.*", "", lua_text(name))  # comments may show example keys
    assert not re.search(r"\{[a-z_]+\}|%\([a-z_]+\)s|\$\{", code), f"{name}.lua looks templated"
