"""The Lua source of each script: the key names it uses, its helper groups, then itself.

A script (``gpuq/lua/<verb>.lua``) names the helper groups it calls at its top, one
``--@include <group>`` line each; a group (``gpuq/lua/lib/<group>.lua``) names the groups it
calls in turn. A script's source is the key names it uses, defined over the pool's base
(``KEYS[1]``) from ``gpuq.keys.SUFFIXES`` (``K_<NAME>`` for a fixed key, ``<name>_key(...)``
for a builder), then each group it needs once (a group after those it includes), then the
script as written. Each call runs the whole chunk, so a key builder or an included helper
the script never reaches (a closure made on every call) is left out.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from gpuq.keys import SUFFIXES, suffix_parts

_INCLUDE = re.compile(r"^--@include\b[ \t]*(\S*)[ \t]*$", re.M)
_GROUP = re.compile(r"\w+")


def lua_name(key: str) -> str:
    """The Lua name of a key of ``SUFFIXES``."""
    if any(arg for _, arg in suffix_parts(key)):
        return f"{key}_key"
    return f"K_{key.upper()}"


def lua_definition(key: str) -> str:
    """The Lua line defining a key's name from the base ``B``."""
    pieces, args = ["B"], []
    for text, arg in suffix_parts(key):
        if text:
            pieces.append(f"'{text}'")  # suffixes are [a-z_:] (tests/unit/test_keys.py)
        if arg:
            pieces.append(arg)
            args.append(arg)
    if args:
        return f"local function {lua_name(key)}({', '.join(args)}) return {' .. '.join(pieces)} end\n"
    return f"local {lua_name(key)} = {' .. '.join(pieces)}\n"


def key_prelude(code: str) -> str:
    """The definitions of the key names ``code`` uses."""
    words = set(re.findall(r"\w+", code))
    return "local B = KEYS[1]\n" + "".join(lua_definition(k) for k in SUFFIXES if lua_name(k) in words)


def _lua_file(*path: str) -> str:
    return resources.files("gpuq").joinpath("lua", *path).read_text()


def _include(text: str, where: str, out: dict[str, str], open_groups: tuple[str, ...]) -> None:
    """Add to ``out`` the groups ``text`` includes, each after the groups it includes."""
    for group in _INCLUDE.findall(text):
        if group in out:
            continue
        if group in open_groups:
            raise ValueError(f"{where}: include cycle {' -> '.join((*open_groups, group))}")
        if not _GROUP.fullmatch(group) or not resources.files("gpuq").joinpath(
                "lua", "lib", f"{group}.lua").is_file():
            raise ValueError(f"{where}: unknown include {group!r} (no gpuq/lua/lib/{group}.lua)")
        source = _lua_file("lib", f"{group}.lua")
        _include(source, f"lib/{group}.lua", out, (*open_groups, group))
        out[group] = source


def included(text: str, where: str) -> dict[str, str]:
    """The helper groups ``text`` needs, by name, in the order they are defined."""
    out: dict[str, str] = {}
    _include(text, where, out, ())
    return out


# a reply's field names, in the order of its values: "--@reply <reply> <name> ..." lines
_REPLY_LINE = re.compile(r"^--@reply[ \t]+(\w+)((?:[ \t]+\w+)+)[ \t]*$", re.M)


def reply_fields(group: str, reply: str) -> tuple[str, ...]:
    """The field names of a reply whose values a helper group sends in a fixed order (its
    ``--@reply`` lines of that reply, joined): written once, in the library's sources, which
    its digest covers (gpuq/functions.py)."""
    names = tuple(n for r, line in _REPLY_LINE.findall(_lua_file("lib", f"{group}.lua"))
                  if r == reply for n in line.split())
    if not names or len(set(names)) != len(names):
        raise ValueError(f"lib/{group}.lua: reply {reply!r} has no field names, or one twice")
    return names


# a helper of a group: the comment lines above it, then "local function <name>" up to the next
_HELPER = re.compile(r"^(?:--[^\n]*\n)*local function (\w+)", re.M)


def helpers(group: str) -> tuple[str, dict[str, str]]:
    """A group's text split into its head (comments, include lines) and its helpers by name."""
    found = list(_HELPER.finditer(group))
    if not found:
        return group, {}
    ends = [m.start() for m in found[1:]] + [len(group)]
    return group[:found[0].start()], {m.group(1): group[m.start():end] for m, end in zip(found, ends)}


def reached(body: str, defined: dict[str, str]) -> set[str]:
    """The helpers ``body`` calls, and those they call in turn."""
    if not defined:
        return set()
    calls = re.compile(r"\b(" + "|".join(defined) + r")\s*\(")
    needed: set[str] = set()
    todo = set(calls.findall(body))
    while todo:
        name = todo.pop()
        needed.add(name)
        todo |= set(calls.findall(defined[name].split("\n", 1)[1])) - needed  # body, not its name
    return needed


def assemble(body: str, where: str) -> str:
    """A script's full source from its text: key names, groups, then the text unchanged. An
    included group's helpers that the script never reaches are left out: the includes say
    what a script may call, and each definition would be a closure made on every call."""
    groups = [helpers(source) for source in included(body, where).values()]
    reach = reached(body, {name: text for _, defined in groups for name, text in defined.items()})
    code = "".join(head + "".join(text for name, text in defined.items() if name in reach) + "\n"
                   for head, defined in groups) + body
    return key_prelude(code) + "\n" + code


@functools.cache
def script_source(name: str) -> str:
    """The source of script ``name`` (gpuq/lua/<name>.lua) as it is loaded into Redis."""
    return assemble(_lua_file(f"{name}.lua"), f"{name}.lua")


# Calls a client sends together that the server runs as one (gpuq/joined.py): a worker's acks
# with its next claim. Each: its two parts, with the place of each part's `now` in its ARGV.
JOINED: dict[str, tuple[tuple[str, int], tuple[str, int]]] = {"ack_claim": (("ack", 3), ("claim", 2))}

# A joined call's arguments: n, the first part's n arguments, then the second's. Each part
# takes "0" or "" as "now, by the server's clock": the clock is read once for both, as
# lib/args.lua's clock() reads it (the wrapper runs outside the parts' blocks, where that
# helper is not in scope: the two must stay the same formula), and passed to them as a
# number, which clock() takes as it is (no text made here for the parts to parse back).
_SPLIT = """\
local n = tonumber(ARGV[1])
if not n or n < 0 or n > #ARGV - 1 or n % 1 ~= 0 then
  return {{1, 0, 'the first argument must count the arguments of the first part'}}
end
local first, second
if #ARGV <= 4000 then  -- each made at its size: grown one by one, a table rehashes at each 2^k
  first, second = {{unpack(ARGV, 2, n + 1)}}, {{unpack(ARGV, n + 2)}}
else  -- past what unpack may put on Lua's stack (8000 values)
  first, second = {{}}, {{}}
  for i = 2, n + 1 do first[i - 1] = ARGV[i] end
  for i = n + 2, #ARGV do second[i - n - 1] = ARGV[i] end
end
local a, b = first[{a}] == '0' or first[{a}] == '', second[{b}] == '0' or second[{b}] == ''
if a or b then
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  if a then first[{a}] = now end
  if b then second[{b}] = now end
end
"""


def joined_split(name: str) -> str:
    """The Lua that splits a joined call's ARGV into its parts' (``first``, ``second``)."""
    (_, a), (_, b) = JOINED[name]
    return _SPLIT.format(a=a, b=b)


@functools.cache
def joined_source(name: str) -> str:
    """A joined call's source for EVALSHA: each part's own source run as a function of its
    arguments (``ARGV`` there is its parameter), the replies as one: {first's, second's}."""
    (one, _), (two, _) = JOINED[name]
    return (f"-- {name}: {one} then {two} in one call (gpuq/joined.py)\n" + joined_split(name)
            + f"local r1 = (function(ARGV)\n{script_source(one)}\nend)(first)\n"
            + f"local r2 = (function(ARGV)\n{script_source(two)}\nend)(second)\n"
            + "return {r1, r2}\n")
