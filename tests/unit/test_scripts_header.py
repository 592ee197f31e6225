"""The Lua scripts' headers agree with gpuq.scripts (codes, KEYS/ARGV/Returns), and each
script's source is its key names, the helper groups it includes, then the script itself."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from gpuq.lua_source import assemble, helpers, included, key_prelude, reached, script_source
from gpuq.replies import Code, header_codes
from gpuq.scripts import SCRIPT_NAMES

LUA = resources.files("gpuq") / "lua"
GROUPS = sorted(p.name[:-4] for p in (LUA / "lib").iterdir() if p.name.endswith(".lua"))


def lua_text(name: str) -> str:
    return (LUA / f"{name}.lua").read_text()


def group_text(group: str) -> str:
    return (LUA / "lib" / f"{group}.lua").read_text()


def header(text: str) -> str:
    """The leading comment block of a Lua file."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


def code(text: str) -> str:
    return re.sub(r"--[^\n]*", "", text)


def helpers_of(text: str) -> set[str]:
    """The helpers a Lua file defines at its top level."""
    return set(re.findall(r"^local function (\w+)", text, re.M))


HELPERS = {g: helpers_of(group_text(g)) for g in GROUPS}


def calls(text: str) -> set[str]:
    """The helpers of any group that ``text`` calls (outside comments and definitions)."""
    every = set().union(*HELPERS.values())
    return set(re.findall(r"(?<!function )\b(\w+)\s*\(", code(text))) & every


def includes(text: str) -> list[str]:
    return re.findall(r"^--@include (\w+)$", text, re.M)


def test_every_lua_file_is_a_known_script() -> None:
    files = {p.name[:-4] for p in LUA.iterdir() if p.name.endswith(".lua")}
    assert files == set(SCRIPT_NAMES)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_header_documents_keys_argv_and_returns(name: str) -> None:
    text = header(lua_text(name))
    assert text.startswith(f"-- {name}.lua: "), "a header opens with the file name and its job"
    for word in ("KEYS[1]", "ARGV[1]", "Returns"):
        assert word in text, f"{name}.lua header lacks {word}"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_header_codes_exist_in_code_enum(name: str) -> None:
    names = {c.name for c in Code}
    assert header_codes(name) <= names
    # Also the form of each: any UPPER_CASE word after a reply in "Returns".
    returns = header(lua_text(name)).split("Returns", 1)[1]
    for number, code_name in re.findall(r"\{(\d+)[^}]*\}\s*:?\s*([A-Z][A-Z_]{2,})\b", returns):
        assert code_name in names, f"{name}.lua promises code {code_name}, missing from Code"
        assert Code[code_name] == int(number), f"{name}.lua: {code_name} is not {number}"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_reply_numbers_in_header_are_codes(name: str) -> None:
    returns = header(lua_text(name)).split("Returns", 1)[1]
    for number in re.findall(r"\{(\d+)", returns):
        assert int(number) in {int(c) for c in Code}


def test_lib_header_code_table_matches_enum() -> None:
    text = header(group_text("args"))
    table = dict(re.findall(r"(\d+) ([A-Z][A-Z_]+)", text))
    assert table == {str(int(c)): c.name for c in Code}


@pytest.mark.parametrize("group", GROUPS)
def test_a_group_opens_with_its_name_and_job(group: str) -> None:
    assert group_text(group).startswith(f"-- lib/{group}.lua: ")
    assert len(group_text(group).splitlines()) < 150, "a group stays small"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_script_source_is_keys_then_groups_then_file_unchanged(name: str) -> None:
    """Scripts are loaded from their files as they are (no Python value is pasted in), after
    the key names they use and each group they need once, as written in its file, less the
    helpers the script never reaches."""
    source, body = script_source(name), lua_text(name)
    assert source.endswith(body)
    groups = [helpers(text) for text in included(body, f"{name}.lua").values()]
    offered = {n: text for _, defined in groups for n, text in defined.items()}
    reach = reached(body, offered)
    middle = "".join(head + "".join(t for n, t in defined.items() if n in reach) + "\n"
                     for head, defined in groups)
    assert source == key_prelude(middle + body) + "\n" + middle + body
    kept = helpers_of(source) - helpers_of(body) - {n for n in helpers_of(source) if n.endswith("_key")}
    assert kept == reach


def test_helpers_no_script_reaches_are_left_out() -> None:
    """An included group's helpers that a script never calls are not defined in its source
    (each would be a closure made on every call); some script leaves one out."""
    dropped = {}
    for name in SCRIPT_NAMES:
        body = lua_text(name)
        groups = [helpers(text) for text in included(body, f"{name}.lua").values()]
        offered = {n for _, defined in groups for n in defined}
        dropped[name] = offered - set(re.findall(r"^local function (\w+)", script_source(name), re.M))
    assert any(dropped.values())
    assert all(not (names & calls(script_source(n))) for n, names in dropped.items())


@pytest.mark.parametrize("text", [*(lua_text(n) for n in SCRIPT_NAMES), *(group_text(g) for g in GROUPS)])
def test_includes_are_exactly_the_groups_called(text: str) -> None:
    """A file includes the group of every helper it calls, and no group it does not call."""
    own = helpers_of(text)
    needed = {g for g, names in HELPERS.items() if (calls(text) - own) & names}
    assert set(includes(text)) == needed, header(text).splitlines()[0]
    assert len(includes(text)) == len(set(includes(text))), "a group included twice"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_helper_is_defined_before_it_is_used(name: str) -> None:
    """A Lua local used before its definition would be read as a (forbidden) global."""
    source = code(script_source(name))
    defined = {m.group(1): m.start() for m in re.finditer(r"^local function (\w+)", source, re.M)}
    for m in re.finditer(r"\b(\w+)\s*\(", source):
        if m.group(1) in set().union(*HELPERS.values()) or m.group(1).endswith("_key"):
            assert defined.get(m.group(1), len(source)) < m.start(), f"{name}: {m.group(1)}"
    for constant in set(re.findall(r"\bK_[A-Z_]+\b", source)):
        assert re.search(rf"^local {constant} = ", source, re.M), f"{name}: {constant}"


def test_a_group_is_included_once_after_those_it_includes() -> None:
    order = list(included("--@include push\n--@include args\n--@include finish\n", "t.lua"))
    assert len(order) == len(set(order))
    assert order.index("args") < order.index("finish") < order.index("push")
    assert order.index("queue") < order.index("corrupt") < order.index("push")
    assert included("return 1", "t.lua") == {}


@pytest.mark.parametrize("line", ["--@include nosuch", "--@include ../args", "--@include"])
def test_an_unknown_include_fails_at_load(line: str) -> None:
    with pytest.raises(ValueError, match="t.lua: unknown include"):
        assemble(f"-- t.lua: x\n{line}\nreturn 1\n", "t.lua")


def test_only_the_key_builders_used_are_defined() -> None:
    ack = script_source("ack")
    assert "local function task_key(" in ack and "local function queue_key(" not in ack
    assert "local function" not in script_source("lead").split("\n\n", 1)[0]


def test_what_one_script_alone_calls_lives_in_it() -> None:
    for group, names in HELPERS.items():
        for helper in names:
            users = [n for n in SCRIPT_NAMES if helper in calls(lua_text(n))]
            by_groups = any(helper in calls(group_text(g)) for g in GROUPS)
            assert by_groups or len(users) > 1, f"{helper} (lib/{group}.lua) serves {users} only"


@pytest.mark.parametrize("text", [*(lua_text(n) for n in SCRIPT_NAMES), *(group_text(g) for g in GROUPS)])
def test_lua_has_no_templating_placeholders(text: str) -> None:
    body = code(text)  # comments may show example keys
    assert not re.search(r"\{[a-z_]+\}|%\([a-z_]+\)s|\$\{", body), "looks templated"


def test_a_claim_s_read_is_readable_s_fields_then_offered_state_and_gpus() -> None:
    """lib/readable.lua's READ_HELD: N_READABLE fields readable checks, then the claim's own."""
    text = group_text("readable")
    (body,) = re.findall(r"^local READ_HELD = \{(.*?)\}", text, re.M | re.S)
    names = re.findall(r"'(\w+)'", body)
    n = int(re.findall(r"^local N_READABLE = (\d+)$", text, re.M)[0])
    assert names[n:] == ["offered", "state", "gpus", "error"] and len(set(names)) == len(names)
    assert names[:3] == ["handler", "payload", "model"] and names[n - 1] == "due_at"
