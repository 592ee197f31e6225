"""Where the Lua time of gpuq's hot scripts goes, line by line.

The library Redis runs (``gpuq.functions.library``) is loaded as it is into lupa's Lua 5.1,
the Lua version Redis embeds, with a ``redis`` table whose ``call`` forwards each command to a
real redis-server (started here) and converts replies and arguments as Redis does. A worker's
loop then runs as ``scripts/bench_instructions.py`` runs it: N one-by-one enqueues, then one
worker claiming and acking each task (an ack and the next claim as one ``ack_claim`` call;
``--batch N``: a batch handler's, N tasks a claim). A Lua hook counts, for each line of the
gpuq/lua files, the VM instructions run there, how often the line ran and the
``redis.call``s it made (by command, per script); the report gives them per task, with the
top lines and functions. C functions the scripts call (string and table helpers, ``cjson``,
the commands themselves) run no VM instructions: a line that calls them costs more than its
count says. The same workload is then run by ``FCALL`` on the server itself (at the same
``now``s) and every reply and key compared: a profile of a run that differs from Redis's
would be of the wrong thing.

    python scripts/profile_lua.py [--tasks 300] [--top 25] [--batch N] [--port P]

Needs ``lupa`` (``pip install lupa``) and redis-server on PATH.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import lupa.lua51 as lupa
import redis
from redis._parsers.resp2 import _RESP2Parser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuq.claims import Claim, ClaimRequest  # noqa: E402
from gpuq.config import Config  # noqa: E402
from gpuq.embedded import EmbeddedServer  # noqa: E402
from gpuq.functions import library  # noqa: E402
from gpuq.joined import carried, joined_acks  # noqa: E402
from gpuq.keys import Keys  # noqa: E402
from gpuq.lua_source import _lua_file, included  # noqa: E402
from gpuq.scripts import SCRIPT_NAMES, Calls  # noqa: E402
from gpuq.task import TaskSpec  # noqa: E402

LUA_DIR = Path(__file__).resolve().parents[1] / "gpuq" / "lua"
T0 = 1_700_000_000_000  # the workload's now (ms), the same for both runs


class Status(bytes):
    """A status reply (``+OK``), which Lua sees as {ok = ...}, not as a string."""


class StatusParser(_RESP2Parser):
    """RESP2 with status replies kept apart from bulk strings."""

    def _read_response(self, disable_decoding: bool = False, timeout: Any = None) -> Any:
        raw = self._buffer.readline()
        kind, rest = raw[:1], raw[1:]
        if kind == b"-":
            return self.parse_error(rest.decode(errors="replace"))
        if kind == b"+":
            return Status(rest)
        if kind == b":":
            return int(rest)
        if rest == b"-1":
            return None
        if kind == b"$":
            return self._buffer.read(int(rest))
        return [self._read_response() for _ in range(int(rest))]


def command(conn: redis.Connection, *args: Any) -> Any:
    conn.send_command(*args)
    try:
        return conn.read_response()
    except redis.ResponseError as exc:
        return exc


GLUE = """
local forward, lua_error = ...
local counts = {instr = {}, lines = {}, calls = {}, fn = {}, c = {}, cmd = {}}
local function bump(t, k) t[k] = (t[k] or 0) + 1 end
local function call(...)
  -- a helper's `return redis.call(...)` is a tail call: counted on the line that called the helper
  local level, info = 3, debug.getinfo(3, 'Sl')
  while info and info.what == 'tail' do level = level + 1; info = debug.getinfo(level, 'Sl') end
  local at = info and info.source == '=gpuq' and info.currentline
  if at then bump(counts.calls, at); bump(counts.cmd, at .. ' ' .. string.upper(tostring((...)))) end
  return forward(...)
end
local redis = {LOG_DEBUG = 0, LOG_VERBOSE = 1, LOG_NOTICE = 2, LOG_WARNING = 3}
function redis.pcall(...) local r = call(...); return r end
function redis.call(...)
  local r = call(...)
  if type(r) == 'table' and r.err then error(r.err, 0) end
  return r
end
function redis.status_reply(s) return {ok = s} end; function redis.error_reply(s) return {err = s} end
function redis.setresp() end; function redis.log() end
local function hook(event, line)
  local info = debug.getinfo(2, 'Sl')
  if event == 'call' then  -- a C function's: counted on its caller's line
    if info.what ~= 'C' then return end
    info = debug.getinfo(3, 'Sl')
    if info and info.source == '=gpuq' then bump(counts.c, info.currentline) end
  elseif info.source ~= '=gpuq' then return
  elseif event == 'line' then bump(counts.lines, line)
  else bump(counts.instr, info.currentline); bump(counts.fn, info.linedefined) end
end
local function profiled(on) if on then debug.sethook(hook, 'cl', 1) else debug.sethook() end end
return redis, counts, profiled
"""


class LuaServer:
    """The library in lupa's Lua 5.1, its commands sent to a real server over ``conn``."""

    def __init__(self, code: str, conn: redis.Connection) -> None:
        self.lua = lupa.LuaRuntime(encoding=None, unpack_returned_tuples=True)
        self.conn = conn
        rt, counts, self.profiled = self.lua.execute(GLUE, self.forward)
        rt[b"sha1hex"] = lambda s: hashlib.sha1(s).hexdigest().encode()
        self.functions: dict[str, Any] = {}
        rt[b"register_function"] = lambda name, fn: self.functions.__setitem__(name.decode(), fn)
        self.counts = counts
        g = self.lua.globals()
        g[b"redis"] = rt
        g[b"cjson"] = self.lua.table_from({b"encode": self.encode, b"decode": self.decode})
        # a library opens with "#!lua ...": a comment here, so its line numbers stay
        self.lua.execute("local chunk = assert(loadstring(...,'=gpuq')); chunk()", ("--" + code).encode())

    def to_lua(self, r: Any) -> Any:
        if isinstance(r, redis.ResponseError):
            return self.lua.table_from({b"err": str(r).encode()})
        if isinstance(r, Status):
            return self.lua.table_from({b"ok": bytes(r)})
        if isinstance(r, list):
            return self.lua.table_from([self.to_lua(x) for x in r])
        return False if r is None else r

    def forward(self, *args: Any) -> Any:
        out = []
        for a in args:
            if isinstance(a, bytes):
                out.append(a)
            elif isinstance(a, (int, float)) and not isinstance(a, bool):
                out.append(b"%.17g" % a)  # as Redis formats a Lua number argument
            else:
                return self.to_lua(
                    redis.ResponseError("Lua redis() command arguments must be strings or integers")
                )
        return self.to_lua(command(self.conn, *out))

    def decode(self, text: bytes) -> Any:
        def lua(v: Any) -> Any:
            if isinstance(v, dict):
                return self.lua.table_from({k.encode(): lua(x) for k, x in v.items()})
            if isinstance(v, list):
                return self.lua.table_from([lua(x) for x in v])
            return v.encode() if isinstance(v, str) else v

        return lua(json.loads(text))  # a ValueError raised in Lua is an error there (pcall)

    def encode(self, value: Any) -> bytes:
        def py(v: Any) -> Any:
            if lupa.lua_type(v) != "table":
                return v.decode() if isinstance(v, bytes) else v
            items = list(v.items())  # Lua's own order, as cjson walks it
            if items and all(isinstance(k, int) for k, _ in items):
                return [py(x) for _, x in sorted(items)]
            return {k.decode(): py(x) for k, x in items}

        return json.dumps(py(value), separators=(",", ":")).encode()

    def fcall(self, name: str, keys: list[bytes], args: list[bytes]) -> Any:
        try:
            r = self.functions[name](self.lua.table_from(keys), self.lua.table_from(args))
        except lupa.LuaError as exc:
            return redis.ResponseError(str(exc))
        return self.reply(r)

    def reply(self, r: Any) -> Any:
        """A Lua value as the reply Redis makes of it."""
        if lupa.lua_type(r) == "table":
            if r[b"err"] is not None:
                return redis.ResponseError(r[b"err"].decode())
            if r[b"ok"] is not None:
                return Status(r[b"ok"])
            out, i = [], 1
            while r[i] is not None:
                out.append(self.reply(r[i]))
                i += 1
            return out
        if r is True:
            return 1
        if r is None or r is False:
            return None
        return int(r) if isinstance(r, (int, float)) else r


class RealServer:
    """The same calls by FCALL on the server itself."""

    def __init__(self, conn: redis.Connection) -> None:
        self.conn = conn

    def fcall(self, name: str, keys: list[bytes], args: list[bytes]) -> Any:
        return command(self.conn, "FCALL", name, len(keys), *keys, *args)


def text(r: Any) -> Any:
    if isinstance(r, list):
        return [text(x) for x in r]
    return r.decode() if isinstance(r, bytes) else r


def workload(server: LuaServer | RealServer, functions: dict[str, str], tasks: int,
             batch: int) -> list[Any]:
    """Enqueue ``tasks`` no-op tasks one by one, then one worker claims and acks each (an ack
    and the next claim as one call, as gpuq.worker sends them, the worker out of `idle` once
    a claim gave it a task); with ``batch``, for a batch handler taking that many a claim
    (its acks joined, riding with the next claim); every reply, in order."""
    config = Config(pool="profile")
    calls, base = Calls(config), [Keys(config.pool, config.prefix).base.encode()]
    replies: list[Any] = []

    def run(call: Any) -> Any:
        r = server.fcall(functions[call.script], base, [str(a).encode() for a in call.args])
        replies.append(r)
        if isinstance(r, Exception):
            raise RuntimeError(f"{call.script}: {r}")
        return text(r)

    handler = "h" if batch else "sim.noop"
    for i in range(tasks):
        spec = TaskSpec.build(handler, {"i": i}, model="m", vram_gb=1, task_id=f"t{i}")
        run(calls.enqueue([spec], now_ms=T0 + i))
    prev: list[dict[str, str]] = []
    batches = [(handler, batch - 1)] if batch else []
    for i in range(tasks + 1):
        now = T0 + tasks + i
        sent = [calls.ack(t["id"], int(t["token"]), '{"i":1}', now_ms=now) for t in prev]
        req = ClaimRequest("w1", 78.0, 0.0, 1, [("m", 1.0)], batches=batches, unlisted=bool(prev))
        ((call, _),) = carried(joined_acks([*sent, calls.claim(req, now_ms=now)]))
        r = run(call)
        got = Claim.parse(r[1] if call.script == "ack_claim" else r)
        if got.task is None:
            break
        prev = [got.task, *(got.batch.tasks if got.batch else [])]
    return replies


def keyspace(client: redis.Redis) -> dict[bytes, Any]:
    out: dict[bytes, Any] = {}
    for k in client.scan_iter(count=1000):
        kind = client.type(k)
        read = {
            b"hash": client.hgetall,
            b"string": client.get,
            b"set": client.smembers,
            b"list": lambda k: client.lrange(k, 0, -1),
            b"zset": lambda k: client.zrange(k, 0, -1, withscores=True),
        }
        out[k] = (kind, read[kind](k), client.pttl(k) > 0) if kind in read else (kind, None, None)
    return out


class LineMap:
    """Each line of the library to the gpuq/lua file and line it came from."""

    def __init__(self, code: str, functions: dict[str, str]) -> None:
        self.lines = code.split("\n")
        owner = {f"RUN['{n}'] = function(keys, args)": n for n in functions} | {
            f"redis.register_function('{f}'": n for n, f in functions.items()
        }
        self.block, name = [""] * len(self.lines), ""
        for i in range(len(self.lines) - 1, -1, -1):  # a script's lines end with its names
            name = next((n for s, n in owner.items() if self.lines[i].startswith(s)), name)
            self.block[i] = name
        for i, line in enumerate(self.lines):  # a joined call's: its name, then its body
            if line.startswith("redis.register_function(") and line.endswith("function(keys, args)"):
                j = i
                while self.lines[j] != "end)":
                    self.block[j] = self.block[i]
                    j += 1
        where: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
        files: dict[str, list[str]] = {}
        for path in sorted(LUA_DIR.rglob("*.lua")):
            rel = str(path.relative_to(LUA_DIR))
            files[rel] = path.read_text().split("\n")
            for n, line in enumerate(files[rel], 1):
                where[line].append((rel, n))
        self.source: list[tuple[str, int] | None] = []
        last: tuple[str, int] | None = None
        for i, line in enumerate(self.lines):
            found = where.get(line) or where.get("local " + line) or []
            mine = self.files_of(self.block[i])
            found = [w for w in found if w[0] in mine] or found
            after = [w for w in found if last and w[0] == last[0] and w[1] > last[1]]
            pick = min(after, key=lambda w: w[1]) if after else (found[0] if found else None)
            self.source.append(pick)
            last = pick or last

    @staticmethod
    def files_of(block: str) -> set[str]:
        if block not in SCRIPT_NAMES:
            return set()
        return {f"{block}.lua"} | {f"lib/{g}.lua" for g in included(_lua_file(f"{block}.lua"), block)}

    def name(self, line: int) -> str:
        where = self.source[line - 1]
        return f"{where[0]}:{where[1]}" if where else f"library:{line}"

    def function(self, line: int) -> str:
        if line == 0:
            return "(library chunk)"
        text = self.lines[line - 1]
        if m := re.search(r"function\s+([\w.]+)", text) or re.search(r"(\w+)\s*=\s*function", text):
            return f"{m[1]} ({self.name(line)})"
        if text.startswith("RUN["):
            return f"{self.block[line - 1]}.lua body"
        return f"function at {self.name(line)}"


def report(lm: LineMap, counts: Any, tasks: int, top: int) -> None:
    def table(t: Any) -> dict[int, int]:
        return {int(k): int(v) for k, v in t.items()}

    instr, lines, calls, fn, c = (table(counts[k]) for k in (b"instr", b"lines", b"calls", b"fn", b"c"))
    commands: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for k, v in counts[b"cmd"].items():
        n, name = k.decode().split(" ", 1)
        commands[lm.block[int(n) - 1]][name] += int(v)
    by_block: dict[str, list[int]] = collections.defaultdict(list)
    for n in set(instr) | set(calls) | set(c):
        by_block[lm.block[n - 1]].append(n)
    print(f"per task: {sum(instr.values()) / tasks:,.0f} Lua VM instructions, "
          f"{sum(c.values()) / tasks:,.1f} calls of C functions, "
          f"{sum(calls.values()) / tasks:.1f} redis.calls ({tasks} tasks)")
    for block, ns in sorted(by_block.items(), key=lambda b: -sum(instr.get(n, 0) for n in b[1])):
        total = sum(instr.get(n, 0) for n in ns)
        by_command = ", ".join(f"{k} {v / tasks:.2f}" for k, v in commands[block].most_common())
        print(f"\n== {block or 'library'}: {total / tasks:,.0f} instructions, "
              f"{sum(c.get(n, 0) for n in ns) / tasks:.1f} C calls, "
              f"{sum(calls.get(n, 0) for n in ns) / tasks:.1f} redis.calls a task\n"
              f"redis.calls a task by command: {by_command or 'none'}\n"
              f"{'instr':>8} {'%':>5} {'runs':>6} {'C':>5} {'redis':>5}  where")
        for n in sorted(ns, key=lambda n: -instr.get(n, 0))[:top]:
            print(f"{instr.get(n, 0) / tasks:8.1f} {100 * instr.get(n, 0) / max(total, 1):5.1f} "
                  f"{lines.get(n, 0) / tasks:6.2f} {c.get(n, 0) / tasks:5.2f} "
                  f"{calls.get(n, 0) / tasks:5.2f}  {lm.name(n):<22} {lm.lines[n - 1].strip()[:70]}")
        funcs = {d: c for d, c in fn.items() if lm.block[max(d, 1) - 1] == block}
        print(f"{'instr':>8} {'%':>5}  function (own lines)")
        for d, own in sorted(funcs.items(), key=lambda x: -x[1])[: max(5, top // 3)]:
            print(f"{own / tasks:8.1f} {100 * own / max(total, 1):5.1f}  {lm.function(d)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=300, help="tasks enqueued, claimed and acked (300)")
    ap.add_argument("--top", type=int, default=25, help="lines shown per script (25)")
    ap.add_argument("--port", type=int, default=0, help="redis-server port (default: a free one)")
    ap.add_argument("--batch", type=int, default=0, help="a batch handler's tasks a claim (0: none)")
    a = ap.parse_args(argv)
    lib = library(SCRIPT_NAMES)
    server = EmbeddedServer()
    server.port = a.port
    server.start()
    try:
        lua_conn = redis.Connection(port=server.port, db=0, parser_class=StatusParser, protocol=2)
        real_conn = redis.Connection(port=server.port, db=1, parser_class=StatusParser, protocol=2)
        command(real_conn, "FUNCTION", "LOAD", lib.source)
        lua = LuaServer(lib.source, lua_conn)
        lua.profiled(True)
        got = workload(lua, lib.functions, a.tasks, a.batch)
        lua.profiled(False)
        want = workload(RealServer(real_conn), lib.functions, a.tasks, a.batch)
        bad = [i for i, (x, y) in enumerate(zip(got, want)) if repr(x) != repr(y)]
        spaces = [keyspace(redis.Redis(port=server.port, db=db)) for db in (0, 1)]
        if bad or spaces[0] != spaces[1]:
            diff = sorted(k for k in spaces[0].keys() | spaces[1].keys()
                          if spaces[0].get(k) != spaces[1].get(k))
            print(f"MISMATCH with redis-server: replies {bad[:5]} (of {len(got)}), keys {diff[:5]}")
            if bad:
                print(f"  lupa:  {got[bad[0]]!r}\n  redis: {want[bad[0]]!r}")
            return 1
        print(f"cross-check: {len(got)} replies and {len(spaces[0])} keys as on redis-server")
        report(LineMap(lib.source, lib.functions), lua.counts, a.tasks, a.top)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
