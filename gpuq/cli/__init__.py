"""The gpuq command line: a thin click group over the library.

``base`` holds the group, its shared options and the error boundary; ``tasks`` the commands
on one task or worker; ``pool`` those that run or watch a pool's processes, and its tools;
``tenants`` the tenant registry; ``schedule`` periodic tasks.
"""

from gpuq.cli import pool, schedule, tasks, tenants
from gpuq.cli.base import cli

for _command in (*tasks.COMMANDS, *pool.COMMANDS, *tenants.COMMANDS, *schedule.COMMANDS):
    cli.add_command(_command)


def main() -> None:
    cli(prog_name="gpuq")


__all__ = ["cli", "main"]
