#!/usr/bin/env python
"""A bounded chaos soak of gpuq on loopback: nothing acknowledged is lost, nothing is written twice.

It starts its own Redis (append-only file, ``appendfsync always`` unless told otherwise) on a
free port, 2 reapers and 6 worker processes (workers.chaos:app; mixed VRAM and concurrency),
and enqueues tasks of mixed priorities, models, durations and kinds (some yield and resume from
a checkpoint, some fail and retry, some are canceled, some carry deadlines) from a sync, an
asyncio and a bulk producer; some run a handler with a ``timeout_s`` past it, and some heed no
stop or yield request (sync and async; some swallow the stop once), so their worker stops them
by force or exits stuck (75) and the soak, as its supervisor, restarts it. Meanwhile it
SIGKILLs workers and the active reaper (replacements start), SIGSTOPs workers past their lease
(busy ones, and idle ones so hand-overs land on a frozen worker) and continues them, kills the
clients' connections (CLIENT KILL) while a hand-over is in flight, and restarts Redis (kill -9
and clean shutdowns, same port and file; each once a hand-over is in flight, if one comes).
Then it drains, checks every task and prints a table.

    python scripts/chaos.py                      # 10,000 tasks (under 30 minutes)
    python scripts/chaos.py --quick              # about 1,000 tasks (under 3 minutes; CI)
    python scripts/chaos.py --fsync everysec     # what that setting can lose
    python scripts/chaos.py --quick --json       # the table as one JSON object on stdout

Exit status: 0 when every invariant holds, 1 when one does not, 2 when the soak itself failed.
Progress goes to stderr. Its processes and temporary directory are removed at the end, also on
Ctrl-C (``--keep`` keeps the directory: logs, run logs, the snapshot the checker read).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # gpuq and workers, from a checkout

from chaos.report import as_json, invariants_ok, table  # noqa: E402
from chaos.settings import FULL, QUICK  # noqa: E402
from chaos.soak import Soak, say  # noqa: E402


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="about 1,000 tasks, under 3 minutes")
    p.add_argument("--tasks", type=int, help="tasks to enqueue (default 10,000; quick 1,000)")
    p.add_argument("--seed", type=int, default=1, help="seed of the workload and the faults")
    p.add_argument("--fsync", choices=["always", "everysec"], default="always",
                   help="the server's appendfsync")
    p.add_argument("--max-minutes", type=float, help="bound on the whole run (default 30; quick 3)")
    p.add_argument("--json", action="store_true", help="print the table as one JSON object")
    p.add_argument("--keep", action="store_true", help="keep the run directory and print its path")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    base = QUICK if args.quick else FULL
    settings = replace(base, seed=args.seed, fsync=args.fsync)
    if args.tasks:  # the enqueue window and the faults scale with the count: the preset's rates
        k = args.tasks / base.tasks
        settings = replace(settings, tasks=args.tasks, enqueue_s=base.enqueue_s * k,
                           redis_restarts=max(2, round(base.redis_restarts * k)),
                           reaper_kills=max(1, round(base.reaper_kills * k)),
                           worker_kills=max(1, round(base.worker_kills * k)),
                           worker_stops=max(1, round(base.worker_stops * k)),
                           idle_stops=max(1, round(base.idle_stops * k)),
                           conn_kills=max(1, round(base.conn_kills * k)))
    if args.max_minutes:
        settings = replace(settings, max_minutes=args.max_minutes)
    # SIGTERM as Ctrl-C (also when started in the background, which ignores SIGINT): the
    # soak's finally blocks stop its processes
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    run_dir = Path(tempfile.mkdtemp(prefix="gpuq-chaos-"))
    try:
        figures = Soak(settings, run_dir).run()
    except KeyboardInterrupt:
        say("interrupted; processes stopped")
        return 130
    except Exception as exc:  # the soak itself failed (not an invariant): one line, exit 2
        say(f"the soak failed: {type(exc).__name__}: {exc}")
        return 2
    finally:
        if args.keep:
            say(f"run directory kept: {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    print(as_json(figures) if args.json else table(figures))
    return 0 if invariants_ok(figures) else 1


if __name__ == "__main__":
    sys.exit(main())
