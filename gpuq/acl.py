"""Least-privilege Redis ACL rules for the roles that use a pool (``gpuq acl`` prints them).

Each role gets its pool's keys only (``~gpuq:{pool}:*``), no Pub/Sub channel, and only the
commands it sends: those its Python code sends (listed here) and those of every Lua script it
runs, read from the scripts themselves, so a script that starts using a command grants it here.

Roles call the scripts' functions (FCALL) but may not load a library: a function runs with
its caller's rights, so a user able to replace gpuq's library (FUNCTION LOAD REPLACE) could
run code of its choosing under every other role's rights. An administrator loads the library
(any client whose user may, e.g. the default user; ``gpuq load-functions``); until then, and
on servers without functions, roles send EVALSHA, whose code is named by its own SHA.

What ACLs cannot do: they check commands and keys, not which script runs. A user allowed
EVALSHA and SCRIPT LOAD may run any script made of its own commands on its own pool's keys,
so the rules keep pools apart and keep every role off admin commands (FLUSHALL, CONFIG,
KEYS, ...) and off every other key, but a leaked producer password can still disturb that
producer's own pool.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from gpuq.errors import ConfigError
from gpuq.keys import Keys
from gpuq.lua_source import script_source

# an ACL user name: printable ASCII but space, quotes and backslash, which redis-cli splits or
# unquotes on (a name "evil on >pw +@all" would add rules); glob characters a pool may hold stay
USER_NAME = re.compile(r"[!#-&(-\[\]-~]+")

# every role: health checks, SELECT of a non-zero db, the scripts' functions, else the
# scripts (loaded again after a server restart or flush), WAIT after writes when
# replica_acks is set, and CLUSTER SLOTS: a redis+cluster:// client finds its pool's master
# with it (gpuq.cluster.SlotMap) before any other command
CONNECTION = ("ping", "select", "cluster|slots", "fcall", "evalsha", "script|load", "wait")
# a command a script sends: named in a call, in tally.lua's set_write (which calls its verb),
# or, for a helper calling a command held in a variable, on a "--@calls CMD ..." line above it
_CALL = re.compile(r"""(?:redis\.p?call|set_write)\(\s*['"](\w+)['"]""")
_CALLS_LINE = re.compile(r"^--@calls((?:[ \t]+[A-Z|]+)+)", re.M)


@dataclass(frozen=True)
class Role:
    summary: str
    scripts: tuple[str, ...]  # the Lua scripts it runs
    commands: tuple[str, ...]  # what its Python code sends besides scripts


# info: status and the reaper read INFO memory, to warn of a server that may evict keys;
# multi/exec: status reads the queues' depths and the parked count together
OBSERVER_READS = ("time", "exists", "get", "hget", "hmget", "hgetall", "hlen", "hvals", "lrange", "smembers",
                  "zcard", "zcount", "zrange", "zrangebyscore", "zscore", "info", "multi", "exec")

ROLES: dict[str, Role] = {
    "producer": Role(
        "enqueue, wait for results, read streams, cancel, requeue, drain a worker, read status",
        ("enqueue", "cancel", "requeue", "follow", "wait"),
        # result waits (BLMOVE on the done list), stream reads (XREAD), drain (LPUSH), the rq
        # bridge's ended list
        (*OBSERVER_READS, "blmove", "xread", "lpush", "lrem")),
    "worker": Role(
        "claim, run, report a cold start, heartbeat, emit and report progress, ack, fail, give "
        "back, retire, learn run times; recover its own last run when it starts under its id, "
        "put back parked tasks it can hold before a burst worker leaves",
        ("claim", "claim_batch", "began", "heartbeat", "ack", "fail", "requeue", "retire",
         "learn", "emit", "progress", "reap", "park"),
        # registration and leaving (MULTI/EXEC), wake and control lists, the model catalog;
        # the live workers' shapes (a burst worker's put-back: gpuq.worker.leaving)
        ("multi", "exec", "blpop", "lpush", "lrange", "del", "hget", "hmget", "hset", "hdel", "hincrby",
         "hincrbyfloat", "sadd", "srem", "zadd", "zrem", "zcard", "zrangebyscore", "zscore", "time")),
    "reaper": Role(
        "recover, expire, park tasks no GPU holds, preempt, keep tenants' room, publish scale "
        "signals, fire periodic tasks (one active per pool)",
        ("lead", "reap", "expire", "park", "preempt", "requeue", "tenant", "fire"),
        # planning reads (the catalog a page a round: SSCAN; the wide tasks' shapes from the
        # top of `need`: ZREVRANGEBYSCORE), scale signals (MULTI/EXEC), the urgent list,
        # settings, warm hints
        (*OBSERVER_READS, "mget", "sscan", "zrevrangebyscore", "multi", "exec", "blpop", "del", "hset",
         "hincrby", "lpush")),
    "operator": Role("register tenants and set the pool's tenant policy (gpuq tenant); add and "
                     "remove periodic tasks (gpuq schedule)", ("tenant",),
                     (*OBSERVER_READS, "hsetnx", "hdel", "multi", "exec")),
    "observer": Role("read only: gpuq status, gpuq top, gpuq exporter", (), OBSERVER_READS),
}


def script_commands(name: str) -> set[str]:
    """The commands a script (with the helpers it pulls in) may call."""
    source = script_source(name)
    annotated = {c for line in _CALLS_LINE.findall(source) for c in line.split()}
    return {c.lower() for c in (*_CALL.findall(source), *annotated)}


def commands(role: str) -> list[str]:
    """Every command the role needs, sorted (observers run no script)."""
    spec = _role(role)
    needed = set(spec.commands) | {c for name in spec.scripts for c in script_commands(name)}
    base = CONNECTION if spec.scripts else tuple(c for c in CONNECTION if c not in
                                                 ("fcall", "evalsha", "script|load", "wait"))
    return sorted(needed | set(base))


def key_pattern(pool: str, prefix: str = "gpuq") -> str:
    """The ACL key glob of a pool, its glob characters escaped."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", Keys(pool, prefix).base) + "*"


def rules(role: str, pool: str, prefix: str = "gpuq") -> list[str]:
    """ACL SETUSER rules after the password: keys, channels and commands."""
    return [f"~{key_pattern(pool, prefix)}", "resetchannels", "-@all", *(f"+{c}" for c in commands(role))]


def setuser(role: str, pool: str, user: str, password: str, prefix: str = "gpuq") -> str:
    """One ``ACL SETUSER`` line; the password goes in as its SHA-256 (``#<hex>``), so the line
    can be stored or shown without revealing it."""
    if not USER_NAME.fullmatch(user):
        raise ConfigError(f"ACL user name {user!r} must be printable ASCII without spaces, quotes "
                          "or backslashes")
    if not password:
        raise ConfigError("the ACL user needs a password")
    digest = hashlib.sha256(password.encode()).hexdigest()
    return " ".join(["ACL SETUSER", user, "reset", "on", f"#{digest}", *rules(role, pool, prefix)])


def setuser_from_env(role: str, pool: str, user: str, variable: str, prefix: str = "gpuq") -> str:
    """``setuser`` with the password read from an environment variable (kept out of shell
    history and process lists)."""
    password = os.environ.get(variable, "")
    if not password:
        raise ConfigError(f"--password-env {variable}: the variable is unset or empty")
    return setuser(role, pool, user, password, prefix)


def _role(role: str) -> Role:
    try:
        return ROLES[role]
    except KeyError:
        raise ConfigError(f"unknown role {role!r}: one of {', '.join(ROLES)}") from None
