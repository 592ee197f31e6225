"""The soak's table (text) or one JSON object."""

from __future__ import annotations

import json
from typing import Any

# (key, label, must be zero)
ROWS = (
    ("tasks", "tasks acknowledged to producers", False),
    ("worker_kills", "workers SIGKILLed (replaced)", False),
    ("reaper_kills", "active reapers SIGKILLed (replaced)", False),
    ("worker_stops", "workers SIGSTOPped past their lease", False),
    ("idle_stops", "idle workers SIGSTOPped (hand-overs land on them)", False),
    ("conn_kills", "client connections killed (CLIENT KILL)", False),
    ("redis_restarts", "Redis restarts (of which kill -9)", False),
    ("faults_with_handed", "faults struck with a hand-over in flight", False),
    ("runs_stopped", "handler runs stopped by force (StopTask, cancel)", False),
    ("stops_past_yield_deadline", "forced stops past a yield deadline", False),
    ("stops_past_grace", "forced stops of lost runs past the grace", False),
    ("stuck_exits", "workers exiting stuck (75), restarted", False),
    ("lost_acked_enqueues", "lost acknowledged enqueues", True),
    ("results_written_twice", "results written twice", True),
    ("results_without_run", "results naming no logged run", True),
    ("runs_beyond_claims", "tasks run more often than claimed", True),
    ("stops_of_held_runs", "runs stopped by force while still their worker's", True),
    ("wrong_endings", "tasks ended other than they should", True),
    ("sla_counts_off", "SLA counts less the tasks decided", True),
    ("started_sla_uncounted", "tasks started with their SLA never counted", True),
    ("stuck_queued_with_idle_fit", "tasks stuck queued while an idle worker fits them", True),
    ("vram_drift_workers", "idle workers with VRAM ledger drift", True),
    ("leftover_keys", "leftover keys after the drain", True),
    ("longest_recovery_s", "longest recovery after a Redis restart (s)", False),
)
DETAIL = ("redis_crashes", "aof_bytes_cut", "acked_in_last_s_before_kills", "endings_read_then_lost",
          "recoveries_s",
          "handler_runs", "runs_ok", "runs_yielded", "runs_failed", "runs_cut_by_kill", "worker_exits",
          "late_acks_rejected", "enqueue_retries", "enqueue_retries_found_written",
          "enqueue_first_try_duplicates", "canceled", "states", "leftovers", "lost_detail", "wall_s")


def invariants_ok(figures: dict[str, Any]) -> bool:
    return all(figures.get(key, 0) == 0 for key, _label, zero in ROWS if zero)


def table(figures: dict[str, Any]) -> str:
    width = max(len(label) for _key, label, _zero in ROWS) + 2
    head = f"chaos soak: seed {figures['seed']}, appendfsync {figures['fsync']}"
    lines = [head, "-" * len(head)]
    for key, label, zero in ROWS:
        value = figures.get(key, "")
        if key == "redis_restarts":
            value = f"{value} ({figures.get('redis_kills', 0)})"
        mark = ("ok" if value == 0 else "FAIL") if zero else ""
        lines.append(f"{label:<{width}}{value!s:>10}  {mark}")
    lines.append("")
    for key in DETAIL:
        if key in figures:
            lines.append(f"{key:<{width}}{json.dumps(figures[key])}")
    lines.append("")
    lines.append("invariants: " + ("all hold" if invariants_ok(figures) else "VIOLATED"))
    return "\n".join(lines)


def as_json(figures: dict[str, Any]) -> str:
    return json.dumps({**figures, "ok": invariants_ok(figures)}, sort_keys=True)
