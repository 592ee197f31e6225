"""The group every command hangs on: its shared options (``GPUQ_*`` variables), the error
boundary (a GpuqError becomes one line and a non-zero exit, never a stack trace; the exit
code says what kind of failure, ``Exit``), and the helpers commands share.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable
from dataclasses import replace
from enum import IntEnum
from typing import Any, TypeVar, get_args, get_type_hints

import click
from click.core import ParameterSource

from gpuq import logs
from gpuq.client import Queue
from gpuq.config import Config
from gpuq.connection import READ_TIMEOUT_S, connect, redis_errors
from gpuq.errors import (
    AppError,
    BadSchedule,
    BadTenant,
    ConfigError,
    ConnectionFailed,
    GpuqError,
    InvalidTask,
    ResultTimeout,
    TaskFailed,
    Unschedulable,
)
from gpuq.redact import one_line, redact
from gpuq.task import Priority, TaskSpec
from gpuq.tls import Tls

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULTS = Config()  # the defaults option help states
PRIORITY_HELP = "P0..P3, 0..3 or online/nearline/batch/offline."
F = TypeVar("F", bound=Callable[..., Any])
# TaskSpec.build's keyword options: their defaults and types make the task options of commands
SPEC = inspect.signature(TaskSpec.build).parameters
SPEC_TYPES = get_type_hints(TaskSpec.build)


class Exit(IntEnum):
    """The CLI's exit codes (README, CLI), so a script can tell its failures apart."""

    OK = 0
    ERROR = 1  # any failure not named below
    # a usage error; an invalid option, setting, app, task, tenant or schedule, a task
    # --check-fit refuses: nothing written
    BAD_INPUT = 2
    NOT_DONE = 3  # the task waited for (--wait, --stream) ended failed, canceled or expired
    TIMED_OUT = 4  # --timeout passed before the task ended: it stands
    NO_REDIS = 5  # Redis could not be used: unreachable, authentication, TLS, no master, refused


# the first kind an error is an instance of gives its code (a subclass before its base)
EXIT_CODES: tuple[tuple[type[GpuqError], Exit], ...] = (
    (InvalidTask, Exit.BAD_INPUT), (ConfigError, Exit.BAD_INPUT), (AppError, Exit.BAD_INPUT),
    (BadTenant, Exit.BAD_INPUT), (BadSchedule, Exit.BAD_INPUT), (Unschedulable, Exit.BAD_INPUT),
    (TaskFailed, Exit.NOT_DONE), (ResultTimeout, Exit.TIMED_OUT), (ConnectionFailed, Exit.NO_REDIS))


# click reads an exception's exit code from its class: one class per code
_FAILURES: dict[Exit, type[click.ClickException]] = {
    code: type(f"Failure{code.name.title().replace('_', '')}", (click.ClickException,),
               {"exit_code": int(code)}) for code in Exit}


def failure(message: str, code: Exit) -> click.ClickException:
    """An error as one line, exiting with ``code``."""
    return _FAILURES[code](message)


def failure_of(exc: GpuqError) -> click.ClickException:
    """A gpuq error as one line (redacted), exiting with the code of its kind."""
    code = next((c for kind, c in EXIT_CODES if isinstance(exc, kind)), Exit.ERROR)
    return failure(one_line(redact(str(exc))), code)


class UsageLine(click.ClickException):
    """A usage error (a missing or malformed option) as one line naming the command's help,
    exit 2: click's own would print the usage and a hint above it."""

    exit_code = Exit.BAD_INPUT

    @classmethod
    def of(cls, exc: click.UsageError) -> UsageLine:
        command = ["gpuq", *exc.ctx.command_path.split()[1:]] if exc.ctx is not None else ["gpuq"]
        # click's own layout (a choice list on indented lines) joins into one line; what is
        # left of control characters (the user's input) is escaped
        text = re.sub(r"\s*\n\s*", " ", exc.format_message())
        return cls(f"{one_line(text)} (see {' '.join(command)} --help)")


class Cli(click.Group):
    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:  # the options before the command
            raise UsageLine.of(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:  # `gpuq tenant`: the group's help
            raise
        except click.UsageError as exc:
            raise UsageLine.of(exc) from None
        except GpuqError as exc:
            raise failure_of(exc) from None
        except UnicodeEncodeError as exc:  # a lone surrogate: bytes given that were not UTF-8
            raise failure(f"{exc.object[:80]!r} is not valid UTF-8 text", Exit.BAD_INPUT) from None
        except KeyboardInterrupt:  # Ctrl-C: the shell's code for SIGINT, not an error's 1
            click.echo("interrupted", err=True)
            ctx.exit(130)


def config_of(ctx: click.Context) -> Config:
    cfg: Config = ctx.obj["config"]
    return cfg


def open_queue(ctx: click.Context, *, block_s: float = 0.0) -> Queue:
    """The pool's queue; its client's reads are bounded: READ_TIMEOUT_S past the longest
    its command blocks on a pop (``block_s``: a worker's idle wait, the reaper's between
    rounds), so a hung server (SIGSTOP, a partition the Sentinels fail over) ends a
    long-lived process's call, to reconnect, rather than hang it for good."""
    cfg = config_of(ctx)
    if ctx.obj.get("empty_url"):  # e.g. --redis "$UNSET": the default server is not what was meant
        raise ConfigError("the Redis URL given (--redis or GPUQ_REDIS_URL) is empty: give one, or "
                          f"leave both out for {DEFAULT_URL}")
    url = cfg.redis_url or DEFAULT_URL
    with redis_errors(url):
        client = connect(url, tls=Tls.of(cfg), pool=cfg.pool,
                         socket_timeout=READ_TIMEOUT_S + block_s)
        ctx.call_on_close(client.close)  # no socket outlives its command (in-process callers)
        client.ping()
    return Queue(client, replace(cfg, redis_url=url), url=url)


def an_id(value: str) -> str:
    """A task or worker id argument: an empty one is a usage error, not an id nobody has."""
    if not value:
        raise click.BadParameter("must not be empty")
    return value


def priority_type(value: str) -> Priority:
    try:
        return Priority.parse(value)
    except GpuqError as exc:
        raise click.BadParameter(exc.args[0]) from None


def task_option(name: str, help: str | None, *, given_only: bool = False,
                **overrides: Any) -> Callable[[F], F]:
    """``--name`` for TaskSpec.build's option ``name``, typed as it is. Its default is
    TaskSpec's (shown; required when it has none), or with ``given_only`` None: not given."""
    default = SPEC[name].default
    kind = next((k for k in get_args(SPEC_TYPES[name]) if k is not type(None)), SPEC_TYPES[name])
    options: dict[str, Any] = {"type": kind if kind in (int, float) else str, "help": help}
    if given_only or default is None:
        options["default"] = None
    elif default is inspect.Parameter.empty:
        options["required"] = True  # no default given: click reports it missing (exit 2)
    else:
        options.update(default=default.label if isinstance(default, Priority) else default,
                       show_default=True)
    return click.option(f"--{name.replace('_', '-')}", **{**options, **overrides})


def no_preempt_option(help: str) -> Callable[[F], F]:
    """TaskSpec's ``preemptible`` (default True) as the flag that turns it off."""
    return click.option("--no-preempt", is_flag=True, help=help)


@click.group(cls=Cli)
@click.version_option(package_name="gpuq", message="%(prog)s %(version)s")
@click.option("--redis", "redis_url", envvar="GPUQ_REDIS_URL", default=None,
              help=f"Redis URL (env GPUQ_REDIS_URL; default {DEFAULT_URL}, the demo embeds one): "
                   "redis://, rediss:// (TLS), unix://, redis+sentinel://HOST:PORT[,...]/MASTER[/DB], "
                   "redis+cluster://HOST:PORT[,...].")
@click.option("--tls-ca", envvar="GPUQ_TLS_CA", help="rediss://: CA file (PEM) the server's certificate "
              "must chain to (env GPUQ_TLS_CA; default: the system's CAs).")
@click.option("--tls-cert", envvar="GPUQ_TLS_CERT", help="rediss://: client certificate (env GPUQ_TLS_CERT).")
@click.option("--tls-key", envvar="GPUQ_TLS_KEY", help="rediss://: its private key (PEM) (env GPUQ_TLS_KEY).")
@click.option("--pool", envvar="GPUQ_POOL", default=DEFAULTS.pool, show_default=True,
              help="Pool name (env GPUQ_POOL).")
@click.option("--log-level", envvar="GPUQ_LOG_LEVEL", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="env GPUQ_LOG_LEVEL; any case.")
@click.option("--log-format", envvar="GPUQ_LOG_FORMAT", default="text", show_default=True,
              type=click.Choice(["text", "json"]),
              help="json: one object per line with the event name and fields (env GPUQ_LOG_FORMAT).")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, tls_ca: str | None, tls_cert: str | None,
        tls_key: str | None, pool: str, log_level: str, log_format: str) -> None:
    """gpuq: a Redis-backed task queue that schedules AI inference work onto GPUs."""
    logs.configure(log_level, log_format)
    try:
        # a flag given wins over its variable, even a bad one (GPUQ_POOL= with --pool p)
        given = {k: v for k, v in (("redis_url", redis_url), ("pool", pool), ("tls_ca", tls_ca),
                                   ("tls_cert", tls_cert), ("tls_key", tls_key))
                 if ctx.get_parameter_source(k) is ParameterSource.COMMANDLINE}
        cfg = Config.from_env(**given)
    except GpuqError as exc:
        raise failure_of(exc) from None
    # click reads an empty variable as not set, and Config an empty URL as "the default"
    empty = redis_url == "" or (redis_url is None and os.environ.get("GPUQ_REDIS_URL") == "")
    ctx.obj = {"config": cfg, "empty_url": empty}
