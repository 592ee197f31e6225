"""Reads what the checker needs after the drain: task hashes, done lists, logs, leftover keys."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import redis

from gpuq.keys import Keys, live_reservation
from workers.chaos import MODELS

from .checker import Snapshot, parse_runs

CHUNK = 500
REJECTED = re.compile(r"lease\.lost task=(\S+) worker=(\S+): result discarded")
# a handler call that returned past its timeout_s, failed by its runner: its result not sent
LATE = re.compile(r"task\.timed_out task=(\S+) worker=(\S+): ran past")
# an ack never sent (Redis down at shutdown) or refused other than as stale (task gone, result
# refused): no result written
ACK_FAILED = re.compile(r"task\.(?:ack|settle)_failed task=(\S+)")
# a warm hand-over's began found it taken back: its handler had started (the attempt given back)
TAKEN_BACK = re.compile(r"gpuq\.worker\.takeup lease\.lost task=(\S+) worker=\S+: taken back")
# a task its worker gave back (attempt not counted) as it shut down or exited stuck: its
# handler may have started
GIVEN_BACK = re.compile(r"task\.requeued task=(\S+) worker=\S+ reason=")
UNREPORTED = re.compile(r"sla\.unreported task=(\S+)")  # began's call failed: SLA uncounted
# a warm hand-over's began that went unanswered: the hand-over may have been taken back at its
# pickup deadline, its handler started, without the worker learning it
UNANSWERED = re.compile(r"gpuq\.worker\.takeup sla\.unreported task=(\S+)")


def read_tasks(client: redis.Redis, keys: Keys, snap: Snapshot) -> None:
    ids = list(snap.acked)
    for i in range(0, len(ids), CHUNK):
        chunk = ids[i:i + CHUNK]
        pipe = client.pipeline(transaction=False)
        for task_id in chunk:
            pipe.hgetall(keys.task(task_id))
            pipe.llen(keys.done(task_id))
        replies = pipe.execute()
        for j, task_id in enumerate(chunk):
            snap.tasks[task_id] = replies[2 * j]
            snap.done_len[task_id] = replies[2 * j + 1]


def read_logs(run_dir: Path, snap: Snapshot) -> None:
    lines: list[str] = []
    for path in sorted((run_dir / "runs").glob("runs-*.log")):
        lines += path.read_text(errors="replace").splitlines()
    snap.runs = parse_runs(lines)
    for path in sorted((run_dir / "logs").glob("w*.log")):
        text = path.read_text(errors="replace")
        snap.rejected.update(Counter(REJECTED.findall(text) + LATE.findall(text)))
        snap.ack_failed |= {(t, path.stem) for t in ACK_FAILED.findall(text)}
        snap.sla_unreported |= set(UNREPORTED.findall(text))
        snap.taken_back.update(TAKEN_BACK.findall(text) + UNANSWERED.findall(text))
        snap.given_back.update(GIVEN_BACK.findall(text))


# the worker's forced stops, by what forced them: a yield not made by its deadline, a run lost
# (canceled, taken back, past its timeout_s) still running past the grace, and a handler
# still running stop_s after either (the worker exits EXIT_STUCK)
FORCED = (("stops_past_yield_deadline", "preempt.stopped task="),
          ("stops_past_grace", "task.stopped task="), ("stuck_exits", "worker.stuck worker="))


def forced_stops(run_dir: Path) -> dict[str, int]:
    out = dict.fromkeys((key for key, _event in FORCED), 0)
    for path in sorted((run_dir / "logs").glob("w*.log")):
        text = path.read_text(errors="replace")
        for key, event in FORCED:
            out[key] += text.count(event)
    return out


def read_sla(client: redis.Redis, keys: Keys, snap: Snapshot) -> None:
    stats = client.hgetall(keys.stats)
    snap.sla_counted = sum(int(v) for k, v in stats.items()
                           if str(k).startswith(("sla_met:P", "sla_missed:P")) and str(k).count(":") == 1)


def read_workers(client: redis.Redis, keys: Keys, snap: Snapshot) -> None:
    names = client.zrange(keys.workers, 0, -1)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(keys.worker(name))
    snap.workers = [w for w in pipe.execute() if w]
    snap.idle_scores = {str(k): float(v) for k, v in client.zrange(keys.idle, 0, -1, withscores=True)}
    snap.footprints = {name: vram for name, (vram, _load) in MODELS.items()}


def scan(client: redis.Redis, pattern: str) -> list[str]:
    return [str(k) for k in client.scan_iter(match=pattern, count=1000)]


def leftovers(client: redis.Redis, keys: Keys, live: set[str]) -> dict[str, int]:
    """Keys a drained pool should not hold: tasks still running or leased to a worker, live
    reservations, model holdings of workers that are gone or no longer hold the model,
    hand-overs not picked up, retries still waiting."""
    now_ms = int(client.time()[0]) * 1000
    tasks_keys = [k for k in scan(client, keys.worker_tasks("*"))]
    held = 0
    models = {w: set(str(client.hget(keys.worker(w), "models") or "").split(",")) for w in live}
    for key in scan(client, keys.holders("*")):
        model = key[len(keys.holders("")):]
        held += sum(1 for w in client.smembers(key) if w not in live or model not in models[w])
    unread = 0
    for key in scan(client, keys.wake("*")):
        unread += sum(1 for m in client.lrange(key, 0, -1) if str(m).startswith("{"))
    reservations = sum(1 for k in scan(client, keys.reservation("*"))
                       if live_reservation(client.get(k), now_ms) is not None)
    return {
        "running": int(client.zcard(keys.running)),
        "leases": sum(int(client.scard(k)) for k in tasks_keys),
        "reservations": reservations,
        "holders": held,
        "offers": int(client.zcard(keys.handed)) + unread,
        "delayed": int(client.zcard(keys.delayed)),
    }


def after_stop(client: redis.Redis, keys: Keys) -> dict[str, int]:
    """Once every worker has left: nothing of any worker may remain."""
    return {
        "workers_listed": int(client.zcard(keys.workers)) + int(client.zcard(keys.idle)),
        "worker_keys": len(scan(client, keys.worker("*"))),
        "holders_after_stop": sum(int(client.scard(k)) for k in scan(client, keys.holders("*"))),
        # a worker's entries in the pool's hashes (its lane and skips, its capacity)
        "worker_entries": int(client.hlen(keys.lanes)) + int(client.hlen(keys.capacities)),
    }


def summary_states(snap: Snapshot) -> dict[str, int]:
    return dict(Counter(f.get("state", "missing") for f in snap.tasks.values()))


def dump(snap: Snapshot, path: Path) -> None:
    """The snapshot as JSON, kept with a failed run's logs for a post-mortem."""
    data = {k: v for k, v in snap.__dict__.items() if k not in ("runs", "rejected", "ack_failed", "killed",
                                                       "sla_unreported", "taken_back")}
    data["runs"] = [r.__dict__ for r in snap.runs]
    data["rejected"] = [[t, w, n] for (t, w), n in snap.rejected.items()]
    data["ack_failed"] = sorted(snap.ack_failed)
    data["killed"] = sorted(snap.killed)
    data["sla_unreported"] = sorted(snap.sla_unreported)
    data["taken_back"] = dict(snap.taken_back)
    path.write_text(json.dumps(data, default=str))
