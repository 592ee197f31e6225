"""gpuq.functions: the library's shape, and how a client reads the server's answers."""

from __future__ import annotations

import pytest
import redis

from gpuq.functions import Sender, _evalsha_sources, check_constants, library, missing
from gpuq.lua_source import JOINED
from gpuq.scripts import SCRIPT_NAMES


def test_every_script_is_a_function_of_one_library_named_by_its_sources() -> None:
    lib = library(SCRIPT_NAMES)
    assert lib.source.startswith(f"#!lua name={lib.name}\n")
    assert set(lib.functions) == set(SCRIPT_NAMES) | set(JOINED)
    for name, function in lib.functions.items():
        assert function == f"{lib.name}_{name}"
        registered = f"redis.register_function('{function}', RUN['{name}'])" in lib.source
        assert registered if name in SCRIPT_NAMES else \
            f"redis.register_function('{function}', function(keys, args)" in lib.source


def test_a_joined_call_is_in_a_library_only_with_its_parts() -> None:
    assert set(library(("ack", "claim")).functions) == {"ack", "claim", "ack_claim"}
    assert set(library(("ack", "fail")).functions) == {"ack", "fail"}
    assert library(("ack",)).name != library(("ack", "claim")).name


def test_state_of_a_helper_group_is_set_again_at_each_call() -> None:
    """lib/tally.lua's `local tally = false` runs inside the function, not once at load."""
    block = library(("ack",)).source
    call = block.index("RUN['ack'] = function(keys, args)")
    assert "\nlocal tally\n" in block[:call] and "\ntally = false\n" in block[call:]


def test_a_constant_of_a_helper_group_is_made_once_at_load() -> None:
    """lib/readable.lua's field lists are made where they stand, outside the function."""
    block = library(("claim",)).source
    call = block.index("RUN['claim'] = function(keys, args)")
    assert "\nlocal READ_HELD = {" in block[:call] and "READ_HELD = {" not in block[call:]


def test_the_claim_replys_field_order_is_part_of_the_library_digest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker reads the claim reply's values by the names of lib/take.lua's --@reply lines:
    ordered otherwise, the library gets another name, so the two never call each other."""
    import gpuq.lua_source as lua_source

    before = library(SCRIPT_NAMES).name
    real = lua_source._lua_file

    def swapped(*path: str) -> str:
        text = real(*path)
        return text.replace("--@reply task id token", "--@reply task token id") if path[-1:] == (
            "take.lua",) else text

    monkeypatch.setattr(lua_source, "_lua_file", swapped)
    lua_source.script_source.cache_clear()
    library.cache_clear()
    try:
        assert lua_source.reply_fields("take", "task")[:3] == ("token", "id", "handler")
        assert library(SCRIPT_NAMES).name != before
    finally:
        lua_source.script_source.cache_clear()
        library.cache_clear()


@pytest.mark.parametrize("change", ["NAMES[2] = 'x'", "NAMES = {}", "table.insert(NAMES, 'x')"])
def test_a_constant_that_is_changed_is_refused(monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    import gpuq.functions as functions

    source = f"local B = KEYS[1]\nlocal NAMES = {{'a'}}\nlocal function f()\n  {change}\nend\nreturn 1\n"
    monkeypatch.setattr(functions, "_lua_file", lambda name: "return 1\n")
    monkeypatch.setattr(functions, "script_source", lambda name: source)
    with pytest.raises(ValueError, match="constant NAMES is changed"):
        functions._block("odd", "gpuq_x_odd")


@pytest.mark.parametrize("reply, expected", [
    (redis.exceptions.NoScriptError("No matching script"), True),
    (redis.ResponseError("Function not found"), True),
    (redis.ResponseError("unknown command 'FCALL', with args beginning with: "), True),
    (redis.ResponseError("Error running script: attempt to compare"), False),
    ([0, "none", 0], False),
])
def test_a_missing_function_or_script_is_told_from_other_replies(reply: object, expected: bool) -> None:
    assert missing(reply) is expected


def test_a_refused_load_turns_the_client_to_evalsha_and_nothing_else_does() -> None:
    sender = Sender(SCRIPT_NAMES, "gpuq:{p}:")
    assert not sender.library_refused(redis.ResponseError("Library 'gpuq_x' already exists"))
    assert sender.fcall
    with pytest.raises(redis.exceptions.ReadOnlyError):
        sender.library_refused(redis.exceptions.ReadOnlyError("You can't write against a read only replica."))
    assert sender.fcall
    assert sender.library_refused(redis.exceptions.NoPermissionError("this user has no permissions"))
    assert not sender.fcall


def test_a_server_without_functions_gets_evalsha() -> None:
    sender = Sender(SCRIPT_NAMES, "gpuq:{p}:")
    assert sender.library_refused(redis.ResponseError("unknown command 'FUNCTION', with args"))
    from gpuq.config import Config
    from gpuq.scripts import Calls

    command = sender.command(Calls(Config()).lead("tok"))
    assert command[:2] == ("EVALSHA", sender.shas["lead"]) and command[3] == "gpuq:{p}:"


def test_a_top_level_statement_that_would_run_once_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpuq.functions as functions

    monkeypatch.setattr(functions, "_lua_file", lambda name: "return 1\n")
    monkeypatch.setattr(functions, "script_source",
                        lambda name: "local B = KEYS[1]\nredis.call('INCR', B)\nreturn 1\n")
    with pytest.raises(ValueError, match="neither a helper"):
        functions._block("odd", "gpuq_x_odd")


def test_a_joined_call_reads_the_clock_as_lib_args_clock_does() -> None:
    """The joined wrapper runs outside the parts' blocks, so it cannot call clock(): the
    formula is written twice and must stay the same."""
    from importlib import resources

    from gpuq.lua_source import joined_split

    formula = "t[1] * 1000 + math.floor(t[2] / 1000)"
    assert formula in resources.files("gpuq").joinpath("lua", "lib", "args.lua").read_text()
    assert all(formula in joined_split(name) for name in JOINED)


def test_every_source_compiles_within_luas_limits() -> None:
    """Lua allows 200 locals a function. Each EVALSHA source (a joined call's wraps its second
    part in a function) and the library compile: a helper more in the claim's includes once
    broke the joined ack_claim's source while FCALL, whose blocks split the locals, loaded."""
    lua51 = pytest.importorskip("lupa.lua51")
    errors = lua51.LuaRuntime().eval("function(s) local _, err = loadstring(s); return err end")
    sources, _ = _evalsha_sources(SCRIPT_NAMES)
    lib = library(SCRIPT_NAMES).source.split("\n", 1)[1]  # its "#!lua" line is the server's
    for name, source in [*sources.items(), ("library", lib)]:
        assert errors(source) is None, (name, errors(source))


@pytest.mark.parametrize("change", ["A = 2", "BB[3] = 1", "BB [k] = v", "table.insert(BB, 1)"])
def test_a_constant_changed_after_it_is_made_fails_the_build(change: str) -> None:
    made = "local A = 1\nlocal BB = {}\nlocal y = A + BB[1]\nif A == 2 then y = BB end\n"
    check_constants("s", ["A", "BB"], made)  # read, compared, passed on: unchanged
    with pytest.raises(ValueError, match="is changed after it is made"):
        check_constants("s", ["A", "BB"], made + change + "\n")
