"""The scripts as one Redis Functions library: its code made once, each call runs its body.

An ``EVALSHA`` runs its script's whole chunk on every call: a closure for each helper it
includes and a string for each key name, before its first line of work (claim: 78 closures
and 31 key names). ``FUNCTION LOAD`` runs a library's chunk once, so gpuq sends its calls as
``FCALL`` of this library (docs/DECISIONS.md, "Client and scripts"; ``scripts/bench_functions.py``
measures both ways).

Each script keeps its source as ``gpuq.lua_source.script_source`` makes it, in a block of
its own: its helpers are made at load; ``KEYS``, ``ARGV`` and the key base ``B`` are bound at
each call; its key names are made again only when the base changes (another pool); a
constant of its helpers' groups (an ALL_CAPS local, e.g. lib/readable.lua's field lists,
which no line assigns to or into) is made once, at load; every other statement of those
groups (state such as lib/tally.lua's ``tally``) runs again at each call, so no call sees
what an earlier one left. Then its text runs as it would under ``EVALSHA``. Each block's
function is also kept in the library's table ``RUN``, so a joined call's function
(``gpuq.lua_source.JOINED``: an ack and the claim after it) calls its parts in turn.

The library's name and its functions' carry a digest of the sources, so clients of two gpuq
versions on one server (a rolling upgrade) each call their own; an old version's library
stays until deleted (``FUNCTION DELETE gpuq_<digest>``).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from dataclasses import dataclass
from typing import Any

import redis

from gpuq.call import Call
from gpuq.lua_source import JOINED, _lua_file, joined_source, joined_split, script_source

log = logging.getLogger(__name__)
# a missing function's error; FCALL unknown to a server before Redis 7
_MISSING = ("Function not found", "unknown command 'FCALL'", "unknown command `FCALL`")
# a server without functions, or a user without function|load (NoPermissionError too)
_REFUSED = ("unknown command", "unknown subcommand", "NOPERM")

_KEY_NAME = re.compile(r"^local (K_\w+) = (.*)$")
_STATEMENT = re.compile(r"^local (\w+(?:\s*,\s*\w+)*) = ")
_CONSTANT = re.compile(r"^[A-Z][A-Z0-9_]*$")


@dataclass(frozen=True)
class Library:
    name: str  # gpuq_<digest>
    source: str  # FUNCTION LOAD's argument
    functions: dict[str, str]  # script name -> its function's name


def function_name(digest: str, script: str) -> str:
    return f"gpuq_{digest}_{script}"


def _block(name: str, function: str) -> list[str]:
    """A script's block: its helpers made once, its function registered."""
    body = _lua_file(f"{name}.lua")
    head = script_source(name)[:-len(body)].split("\n")
    if head[0] != "local B = KEYS[1]":  # gpuq.lua_source.key_prelude's first line
        raise ValueError(f"{name}: unexpected first line {head[0]!r}")
    key_names: list[tuple[str, str]] = []
    per_call: list[str] = []  # statements run again at each call
    declared: list[str] = []
    kept: list[str] = []
    constants: list[str] = []
    lines = head[1:]
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := _KEY_NAME.match(line):
            key_names.append((m[1], m[2]))
        elif (m := _STATEMENT.match(line)) and not line.startswith("local function"):
            statement = [line[len("local "):]]
            while i + 1 < len(lines) and lines[i + 1][:1] in (" ", "\t"):  # its continuation
                i += 1
                statement.append(lines[i])
            names = [n.strip() for n in m[1].split(",")]
            if all(_CONSTANT.match(n) for n in names):  # made once, where it stands
                constants += names
                kept.append("local " + "\n".join(statement))
            else:
                declared.append(m[1])
                per_call.append("\n".join(statement))
        elif line[:1] in ("", " ", "\t") or line.startswith(("--", "local function ", "end")):
            kept.append(line)
        else:  # run once at load, it would act on the first call only: say so at build
            raise ValueError(f"{name}: a helper group's top-level statement {line!r} is neither "
                             "a helper, a local nor a comment")
        i += 1
    check_constants(name, constants, script_source(name))
    return ["do",
            *(f"local {k}" for k, _ in key_names), *(f"local {names}" for names in declared),
            "local base",
            "local function bind() " + " ".join(f"{k} = {v}" for k, v in key_names) + " end",
            *kept,
            f"RUN['{name}'] = function(keys, args)",
            "KEYS, ARGV, B = keys, args, keys[1]",
            "if base ~= B then base = B; bind() end",
            *per_call,
            body,
            "end",
            f"redis.register_function('{function}', RUN['{name}'])",
            "end"]


def _joined_block(name: str, function: str) -> list[str]:
    """A joined call's function: its parts' functions called in turn (gpuq.lua_source.JOINED)."""
    (one, _), (two, _) = JOINED[name]
    return [f"redis.register_function('{function}', function(keys, args)",
            "local ARGV = args",
            joined_split(name),
            f"return {{RUN['{one}'](keys, first), RUN['{two}'](keys, second)}}",
            "end)"]


def check_constants(script: str, names: list[str], source: str) -> None:
    """A constant made once at load must not change: no line assigns to it or into it. One
    search for them all: a search a constant was most of a process's start (every client
    builds the library)."""
    if not names:
        return
    alt = "|".join(map(re.escape, names))
    made = re.sub(rf"local (?:{alt}) =", "", source)
    found = re.search(rf"(?<![\w.])({alt})\s*(\[[^\]]*\]\s*)?=(?!=)|table\.\w+\(\s*({alt})\b", made)
    if found:
        raise ValueError(f"{script}: constant {found[1] or found[3]} is changed after it is made")


@functools.cache
def library(names: tuple[str, ...]) -> Library:
    """The library of the named scripts (gpuq.scripts.SCRIPT_NAMES)."""
    joined = _joined(names)
    sources = [script_source(n) for n in names] + [joined_source(n) for n in joined]
    digest = hashlib.sha1("\0".join(sources).encode()).hexdigest()[:16]
    functions = {n: function_name(digest, n) for n in (*names, *joined)}
    lines = [f"#!lua name=gpuq_{digest}", "local KEYS, ARGV, B = {}, {}, nil", "local RUN = {}"]
    for n in names:
        lines += _block(n, functions[n])
    for n in joined:
        lines += _joined_block(n, functions[n])
    return Library(f"gpuq_{digest}", "\n".join(lines) + "\n", functions)


def _joined(names: tuple[str, ...]) -> list[str]:
    """The joined calls whose parts are all among the scripts ``names``."""
    return [n for n, parts in JOINED.items() if all(p in names for p, _ in parts)]


def already_loaded(exc: redis.ResponseError) -> bool:
    """Whether a FUNCTION LOAD error says the library is there (another client loaded it)."""
    return "already exists" in str(exc)


@functools.cache
def _evalsha_sources(names: tuple[str, ...]) -> tuple[dict[str, str], dict[str, str]]:
    """Each script's own source and its SHA (EVALSHA's name for it), made once a process."""
    sources = {n: script_source(n) for n in names} | {n: joined_source(n) for n in _joined(names)}
    return sources, {n: hashlib.sha1(s.encode()).hexdigest() for n, s in sources.items()}


def missing(reply: Any) -> bool:
    """Whether a call's reply says its code is not on the server (restarted, flushed, or a
    server without functions): the call ran nothing and is sent again once it is loaded."""
    if isinstance(reply, redis.exceptions.NoScriptError):
        return True
    return isinstance(reply, redis.ResponseError) and str(reply).startswith(_MISSING)


class Sender:
    """How one client sends script calls: ``FCALL`` of the library, or ``EVALSHA`` of each
    script once the server could not load the library (no FUNCTION before Redis 7, or an ACL
    user without ``function|load``: docs/DECISIONS.md)."""

    def __init__(self, names: tuple[str, ...], base: str) -> None:
        self.library = library(names)
        self.sources, self.shas = _evalsha_sources(names)
        self.base = base
        self.fcall = True
        self.refusal = ""  # why the library was refused, logged once the scripts load instead

    def command(self, call: Call[Any]) -> tuple[Any, ...]:
        return (*self.head(call.script), *call.args)

    def head(self, script: str) -> tuple[Any, ...]:
        """A call's command before its arguments."""
        if self.fcall:
            return ("FCALL", self.library.functions[script], 1, self.base)
        return ("EVALSHA", self.shas[script], 1, self.base)

    def library_refused(self, exc: redis.ResponseError) -> bool:
        """After a FUNCTION LOAD error: False when the library is there anyway (another
        client loaded it first); True when this server will not load it for this client (no
        such command, or no permission), which then sends EVALSHA from now on. Any other
        error (a read-only replica, out of memory) passes now and is raised."""
        if already_loaded(exc):
            return False
        if not (isinstance(exc, redis.exceptions.NoPermissionError) or str(exc).startswith(_REFUSED)):
            raise exc
        self.fcall = False
        self.refusal = str(exc)
        return True

    def scripts_loaded(self) -> None:
        """Say once that this client sends EVALSHA, after its scripts loaded: a server that
        refuses them too (a Sentinel's port) ends in one error line, not a warning first."""
        if self.refusal:
            log.warning("scripts.evalsha library=%s reason=%s: sending EVALSHA", self.library.name,
                        self.refusal)
            self.refusal = ""
