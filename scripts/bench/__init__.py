"""Throughput and latency of gpuq, side by side with a hand-written minimal queue, rq and BullMQ.

``scripts/bench_throughput.py`` is the entry point; docs/BENCHMARKS.md explains each figure.

* ``common``: sizes, constants, the shared ``Bench`` context (server, names, bookkeeping client);
* ``minimal``: the minimal queue the issue measures gpuq against, and its worker process;
* ``procs``: starting, waiting for and stopping worker processes;
* ``stats``: percentiles, INFO commandstats windows, drain timing from task records;
* ``monitor``: MONITOR-based split of client-issued vs Lua-internal commands;
* ``gpuq_side``, ``minimal_side``, ``rq_side``: each queue's enqueue, drain and latency runs;
* ``bullmq_side``: BullMQ's install, enqueue and drain, driving the Node scripts in ``bullmq/``;
* ``claim_latency``: claim round trips with 1k and 1M tasks queued;
* ``commands``: commands per task (MONITOR pass) and server time per script call;
* ``runner``: the whole run, phase by phase; ``report``: ratios, targets, environment, table.
"""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPTS_DIR = Path(__file__).resolve().parent.parent
ROOT = SCRIPTS_DIR.parent
if str(ROOT) not in sys.path:  # run from a checkout without an install
    sys.path.insert(0, str(ROOT))
