"""Recovering what dead workers and expired leases left: reap.lua's bounded calls repeated
until one leaves nothing undone, and the log lines naming what became of each task. The
reaper runs it every round; a worker starting under the id of a run that stopped beating
runs it first, so that run's tasks go back to their queues at once."""

from __future__ import annotations

import logging

from gpuq.scripts import Calls, ReapResult, Scripts

NAMED_MAX = 50  # tasks one recovery log line names
LIMIT = 100  # leases, workers and retries one call handles


def reap_all(scripts: Scripts, calls: Calls, log: logging.Logger, pool: str) -> ReapResult:
    """One full recovery pass, logged: a line of counts, then one per dead worker and one
    for the leases that expired (``name_recovered``)."""
    total = ReapResult(0, 0, 0, 0)
    while True:
        r = scripts.run(calls.reap(limit=LIMIT))
        total = total + r
        if r.requeued + r.failed + r.promoted < LIMIT and r.dead_workers < LIMIT:
            break
    if total.requeued or total.failed or total.dead_workers:
        log.warning("reaper.recovered pool=%s requeued=%d failed=%d dead_workers=%d",
                    pool, total.requeued, total.failed, total.dead_workers)
        name_recovered(total, log, pool)
    return total


def name_recovered(total: ReapResult, log: logging.Logger, pool: str) -> None:
    """Which workers died and what became of each task recovered (id:state): a line per
    dead worker, one for the leases that expired (a mass expiry names the first NAMED_MAX)."""
    by_worker: dict[str, list[str]] = {}
    for worker, task_id, state in total.recovered:
        by_worker.setdefault(worker, []).extend([f"{task_id}:{state}"] if task_id else [])
    for worker, tasks in by_worker.items():
        more = f" (+{len(tasks) - NAMED_MAX} more)" if len(tasks) > NAMED_MAX else ""
        named = ",".join(tasks[:NAMED_MAX]) or "none"
        if worker:
            log.warning("reaper.worker_dead pool=%s worker=%s tasks=%s%s", pool, worker, named, more)
        else:
            log.warning("reaper.lease_expired pool=%s tasks=%s%s", pool, named, more)
