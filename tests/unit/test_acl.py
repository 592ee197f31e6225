"""ACL rules per role: every command of the role's scripts granted, no admin command, the
password only as its hash, and ``gpuq acl`` printing the line."""

from __future__ import annotations

import hashlib

import pytest
from click.testing import CliRunner

from gpuq import acl
from gpuq.cli import cli
from gpuq.errors import ConfigError
from gpuq.scripts import SCRIPT_NAMES

SECRET = "s3cret"


def test_every_script_belongs_to_a_role_and_no_role_gets_an_admin_command() -> None:
    """A new script must be given to a role (its commands then join that role's rules)."""
    ran = {name for spec in acl.ROLES.values() for name in spec.scripts}
    assert ran == set(SCRIPT_NAMES)
    assert {"set", "hgetall", "zcount"} <= acl.script_commands("lead") | acl.script_commands("enqueue") | \
        acl.script_commands("retire")  # read from the Lua source, helpers included
    for role in acl.ROLES:
        granted = set(acl.commands(role))
        assert not {"flushall", "flushdb", "config", "keys", "eval", "script|flush", "debug", "acl",
                    "shutdown", "subscribe", "publish"} & granted, role
        assert {"ping", "select"} <= granted
    assert "evalsha" not in acl.commands("observer") and "set" not in acl.commands("producer")
    assert "blmove" not in acl.commands("worker") and "blmove" not in acl.commands("reaper")


def test_a_result_waiter_may_register_and_block() -> None:
    """Waiters (producers) send wait.lua with every pop: its commands are granted."""
    assert "wait" in acl.ROLES["producer"].scripts
    assert {"blmove", "hmget", "exists", "lpush", "pttl", "pexpire", "hset"} <= set(acl.commands("producer"))


def test_acl_line_holds_the_hash_not_the_password() -> None:
    line = acl.setuser("worker", "p[1]", "gpuq-w", SECRET)
    assert SECRET not in line and "#" in line
    assert " ~gpuq:{p\\[1\\]}:* resetchannels -@all " in line
    with pytest.raises(ConfigError, match="unknown role"):
        acl.setuser("admin", "p", "u", "pw")


def test_gpuq_acl_prints_the_line_for_this_pool() -> None:
    env = {"GPUQ_ACL_PW": SECRET, "GPUQ_PREFIX": "gq"}
    result = CliRunner().invoke(cli, ["--pool", "batch", "acl", "--role", "reaper", "--password-env",
                                      "GPUQ_ACL_PW"], env=env)
    assert result.exit_code == 0, result.output
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    # the prefix names the user: found by a security review, another prefix's pool of the same
    # name got the same user, and its line reset the first's password and keys
    assert result.stdout.startswith(f"ACL SETUSER gq-reaper-batch reset on #{digest} ~gq:{{batch}}:* ")
    assert SECRET not in result.output and "+set" in result.stdout.split()
    missing = CliRunner().invoke(cli, ["acl", "--role", "worker", "--password-env", "GPUQ_ACL_UNSET"])
    assert missing.exit_code == 2  # bad input or configuration
    assert missing.stderr == ("Error: configuration: --password-env GPUQ_ACL_UNSET: the variable is "
                              "unset or empty\n")


@pytest.mark.parametrize("user", ["", "evil on >pw +@all ~*", "a\tb", "a\x1bb", "a'b", 'a"b', "a\\b",
                                  "n\u00e9"])
def test_a_user_name_the_line_could_misread_is_refused(user: str) -> None:
    result = CliRunner().invoke(cli, ["acl", "--role", "producer", "--password-env", "GPUQ_ACL_PW",
                                      "--user", user], env={"GPUQ_ACL_PW": SECRET})
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("Error: configuration: ACL user name ")
    assert "printable ASCII without spaces, quotes or backslashes" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_user_names_of_odd_pools_and_addresses_are_kept() -> None:
    assert acl.setuser("producer", "p", "svc.gpuq@host:1", SECRET).startswith("ACL SETUSER svc.gpuq@host:1 ")
    result = CliRunner().invoke(cli, ["--pool", "a*", "acl", "--role", "observer", "--password-env",
                                      "GPUQ_ACL_PW"], env={"GPUQ_ACL_PW": SECRET})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ACL SETUSER gpuq-observer-a* reset on #")


def test_commands_called_through_a_variable_are_granted() -> None:
    """finish.lua's set_write('SREM', ...) (cancel, requeue) and wake.lua's tightest (enqueue,
    claim: ZREVRANGEBYSCORE for a multi-GPU task) call their command through a variable: a
    producer cancelling or requeueing a running task was refused SREM."""
    for script in ("cancel", "requeue"):
        assert "srem" in acl.script_commands(script), script
    for script in ("enqueue", "claim", "requeue"):
        assert "zrevrangebyscore" in acl.script_commands(script), script
    assert {"srem", "zrevrangebyscore"} <= set(acl.commands("producer"))
    assert "zrevrangebyscore" in acl.commands("worker")


def test_every_call_by_variable_is_declared() -> None:
    """A helper calling ``redis.call(verb, ...)`` on a variable lists what it may call on a
    ``--@calls`` line (set_write's verbs are read at its call sites), so acl grants it."""
    import re
    from importlib import resources

    from gpuq.lua_source import helpers

    lib = resources.files("gpuq").joinpath("lua", "lib")
    dynamic = re.compile(r"redis\.p?call\(\s*[^'\"\s]")
    for entry in lib.iterdir():
        _, defined = helpers(entry.read_text())
        for name, text in defined.items():
            if dynamic.search(text) and name not in ("set_write", "tally_flush"):
                assert "--@calls " in text, f"{entry.name}: {name} calls a command by variable"


@pytest.mark.parametrize("role", sorted(acl.ROLES))
def test_every_role_may_find_its_pools_master_on_a_cluster(role: str) -> None:
    """Regression: no role was granted CLUSTER SLOTS, which a redis+cluster:// client sends
    first (gpuq.cluster.SlotMap): every least-privilege user got NOPERM on a Redis Cluster."""
    assert "+cluster|slots" in acl.rules(role, "p")
