"""The invariant checker: pure functions from what the soak collected to the figures it reports.

Inputs (``Snapshot``) are plain data read after the drain: the producers' acknowledged ids,
every such task's hash, how many times each task was ended (its ``done`` list grows by one per
ending once the observer registered as its waiter), the first ending a client read, the
handlers' run logs, the rejections and failed acks the workers logged, the live workers'
hashes and the leftover keys. Nothing here talks to Redis, so the unit tests feed it
fabricated snapshots and see it fail.

A result counts as written twice when any of three witnesses says so:

* Redis: the task's done list holds more than one ending;
* a client: the first ending read of the task differs from its final one (a task gone
  altogether counts as a lost enqueue, and as an ending read then lost);
* the run logs: a handler run that returned a result is not the run the final result of the
  (still stored) task names, and its worker neither logged the ack rejected (a fenced late
  ack: ``lease.lost ... result discarded``), nor failed to send it, nor was killed before it
  could (unknown, not counted).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpuq.worker_record import usable_gb

TERMINAL = frozenset({"succeeded", "failed", "expired", "canceled"})
DRIFT_GB = 0.01  # rounding of the worker hash's free VRAM (3 decimals) and float sums


@dataclass(frozen=True)
class Run:
    """One handler run from a run log: its end is "" when the run has no end line (killed)."""

    task: str
    attempt: int
    worker: str
    run: str
    end: str = ""
    lost: bool = False


@dataclass
class Snapshot:
    acked: dict[str, str] = field(default_factory=dict)  # task id -> producer
    tasks: dict[str, dict[str, str]] = field(default_factory=dict)  # {} when the hash is gone
    done_len: dict[str, int] = field(default_factory=dict)
    observed: dict[str, tuple[str, str]] = field(default_factory=dict)  # first (state, run) read
    runs: list[Run] = field(default_factory=list)
    rejected: Counter[tuple[str, str]] = field(default_factory=Counter)  # (task, worker)
    ack_failed: set[tuple[str, str]] = field(default_factory=set)  # (task, worker)
    killed: set[str] = field(default_factory=set)  # workers SIGKILLed (ack unknown)
    workers: list[dict[str, str]] = field(default_factory=list)  # live worker hashes after the drain
    idle_scores: dict[str, float] = field(default_factory=dict)  # the idle set's claimable VRAM
    footprints: dict[str, float] = field(default_factory=dict)  # model -> GB
    leftovers: dict[str, int] = field(default_factory=dict)
    stuck_seen: set[str] = field(default_factory=set)  # noted stuck during the run (chaos.stuck)
    # task -> its warm hand-overs taken back with their handler started (the attempt given back)
    taken_back: Counter[str] = field(default_factory=Counter)
    # task -> times a worker gave it back, its attempt uncounted, as it exited (stuck)
    given_back: Counter[str] = field(default_factory=Counter)
    sla_counted: int = 0  # the pool's stats: sla_met + sla_missed over every priority
    sla_unreported: set[str] = field(default_factory=set)  # began's call failed (logged)
    # task id -> what a cancel of it answered: the state it found ("queued", "running"...),
    # "already <state>" (it had ended), or "unknown" (the call failed: applied or not)
    cancels: dict[str, str] = field(default_factory=dict)


def parse_runs(lines: list[str]) -> list[Run]:
    """Run-log lines into runs (start lines joined with their end line by run id)."""
    starts: dict[str, Run] = {}
    ends: dict[str, tuple[str, bool]] = {}
    for line in lines:
        parts = line.split()
        if len(parts) < 5:
            continue  # a torn last line of a killed process
        event, task, attempt, worker, run = parts[:5]
        if event == "start":
            starts[run] = Run(task, int(attempt), worker, run)
        else:
            ends[run] = (event, len(parts) > 5 and parts[5] == "1")
    out = []
    for run_id, r in starts.items():
        end, lost = ends.get(run_id, ("", False))
        out.append(Run(r.task, r.attempt, r.worker, run_id, end, lost))
    return out


def run_of(result: str | None) -> str:
    """The run id a chaos handler put in its result ("" when none)."""
    try:
        value = json.loads(result) if result else None
    except ValueError:
        return ""
    return str(value.get("run", "")) if isinstance(value, dict) else ""


def lost_enqueues(s: Snapshot) -> list[str]:
    """Acknowledged tasks whose hash is gone or that never ended."""
    return [t for t in s.acked if s.tasks.get(t, {}).get("state") not in TERMINAL]


def written_twice(s: Snapshot) -> dict[str, list[str]]:
    """Task id -> the witnesses that saw its ending written more than once."""
    out: dict[str, list[str]] = {}
    for task_id in s.acked:
        if s.done_len.get(task_id, 0) > 1:
            out.setdefault(task_id, []).append("redis")
    for task_id, seen in s.observed.items():
        fields = s.tasks.get(task_id, {})
        final = (fields.get("state", ""), run_of(fields.get("result")))
        if fields and seen != final:  # a task gone altogether is a lost enqueue
            out.setdefault(task_id, []).append("client")
    for task_id in unexplained_results(s):
        out.setdefault(task_id, []).append("runs")
    return out


def unexplained_results(s: Snapshot) -> list[str]:
    """Tasks with a successful run whose result is not the final one and whose fate the
    worker's log does not explain."""
    rejected = Counter(s.rejected)
    out = []
    for r in s.runs:
        if r.end != "ok" or r.task not in s.acked:
            continue
        fields = s.tasks.get(r.task, {})
        if not fields:
            continue  # the task itself is gone: a lost enqueue, counted as such
        if fields.get("state") == "succeeded" and run_of(fields.get("result")) == r.run:
            continue
        if rejected[(r.task, r.worker)] > 0:
            rejected[(r.task, r.worker)] -= 1
            continue
        if (r.task, r.worker) in s.ack_failed or r.worker in s.killed:
            continue
        out.append(r.task)
    return sorted(set(out))


def runs_beyond_claims(s: Snapshot) -> list[str]:
    """Tasks whose handler started more often than they were claimed: each claim counts an
    attempt, and a yield (or a stop) gives its attempt back while counting a preemption, and
    a warm hand-over taken back before its began arrived (its handler started, the run lost)
    gives it back too, as does a worker that exits (stuck) for the tasks it still ran, so
    starts can never exceed attempt + preemptions + those unless a run had no claim of its own."""
    starts = Counter(r.task for r in s.runs)
    out = []
    for task_id, n in starts.items():
        f = s.tasks.get(task_id)
        given_back = (int(f.get("preemptions") or 0) + s.taken_back[task_id] + s.given_back[task_id]
                      if f else 0)
        if f and n > int(f.get("attempt") or 0) + given_back:
            out.append(task_id)
    return sorted(out)


def stopped_held(s: Snapshot) -> list[str]:
    """Tasks with a run stopped by force (StopTask, a cancel of its asyncio task) though its
    worker had not given it up: a stop goes only to a run requeued past its yield deadline
    or lost (canceled, taken back, past its timeout_s), each marked lost before the stop."""
    return sorted({r.task for r in s.runs if r.end == "stop" and not r.lost})


def orphan_results(s: Snapshot) -> list[str]:
    """Succeeded tasks whose result names no logged successful run (a result from nowhere,
    or from a run stopped by force that returned all the same)."""
    ok = {r.run for r in s.runs if r.end == "ok"}
    return [t for t in s.acked if s.tasks.get(t, {}).get("state") == "succeeded"
            and run_of(s.tasks[t].get("result")) not in ok]


def _kind(fields: dict[str, str]) -> str:
    """The chaos handler's kind in the task's payload ("" when unreadable)."""
    try:
        payload = json.loads(fields.get("payload") or "{}")
    except ValueError:
        return ""
    return str(payload.get("kind", "")) if isinstance(payload, dict) else ""


def ending_fault(fields: dict[str, str], cancel: str | None) -> str:
    """Why an ended task's ending is not one its kind, deadline and cancel allow ("" when
    it is): canceled only when a cancel was sent, and so when one found it not ended; ended
    as a cancel found it already ended; expired only with a deadline (at its expiry pass or
    on its way back to its queue); failed only once its attempts ran out; a task failing
    every attempt never succeeds."""
    state = fields.get("state", "")
    if cancel is not None and cancel != "unknown":
        found = cancel.removeprefix("already ")
        if cancel == found and state != "canceled":
            return f"canceled while {found}, ended {state}"
        if cancel != found and state != found:
            return f"a cancel found it {found}, ended {state}"
    if state == "canceled" and cancel is None:
        return "canceled, never asked to be"
    if state == "expired" and not fields.get("deadline"):
        return "expired without a deadline"
    if state == "succeeded" and _kind(fields) in ("fail_always", "timeout_always"):
        return "succeeded, though every attempt fails"
    if fields.get("attempt") and fields.get("max_attempts"):
        if int(fields["attempt"]) > int(fields["max_attempts"]):
            return f"ran {fields['attempt']} attempts of {fields['max_attempts']}"
    if state == "failed" and fields.get("attempt") and fields.get("max_attempts"):
        if int(fields["attempt"]) < int(fields["max_attempts"]):
            return f"failed after {fields['attempt']} of {fields['max_attempts']} attempts"
    return ""


def wrong_endings(s: Snapshot) -> dict[str, str]:
    """Ended task id -> why its ending is not one it should have (ending_fault)."""
    out = {}
    for task_id in s.acked:
        fields = s.tasks.get(task_id) or {}
        if fields.get("state") not in TERMINAL:
            continue  # not ended: a lost enqueue, counted as such
        why = ending_fault(fields, s.cancels.get(task_id))
        if why:
            out[task_id] = why
    return out


def sla_off(s: Snapshot) -> int:
    """The pool's SLA counts less the acknowledged tasks decided (``began_at``, written with
    the count, or expired without it: a miss counted as it ends): a task counted twice, or
    counted without being marked, shows here."""
    return s.sla_counted - sum(1 for t in s.acked if decided(s.tasks.get(t) or {}))


def decided(task: dict[str, str]) -> bool:
    """Whether the task's SLA was counted: at its handler's first start, or at its expiry
    if it never started (lib/start.lua note_miss)."""
    return bool(task.get("began_at")) or task.get("state") == "expired"


def started_uncounted(s: Snapshot) -> list[str]:
    """Tasks whose handler started (a run logged) and whose SLA was never decided, but for a
    began whose call failed with Redis away (logged ``sla.unreported``: uncounted by design)
    and a warm hand-over whose began found it taken back (canceled first) and that ended
    without another run."""
    started = Counter(r.task for r in s.runs)
    return sorted(t for t in started if t in s.acked and s.tasks.get(t)
                  and not s.tasks[t].get("began_at") and t not in s.sla_unreported
                  and not (started[t] <= s.taken_back[t] and s.tasks[t].get("state") in TERMINAL))


def _idle(worker: dict[str, str]) -> bool:
    return worker.get("state") == "idle" and worker.get("running", "0") == "0"


def _usable(worker: dict[str, str]) -> float:
    return usable_gb(worker["vram_total_gb"], worker.get("kv_reserve_gb"))


def stuck_queued(s: Snapshot) -> list[str]:
    """Tasks still queued after the drain while an idle worker could run them, and those
    noted stuck so during the run."""
    idle = [w for w in s.workers if _idle(w)]
    out = sorted(s.stuck_seen)
    for task_id in s.acked:
        f = s.tasks.get(task_id, {})
        if f.get("state") != "queued":
            continue
        need, level = float(f["vram_gb"]), f["priority"]
        if task_id not in s.stuck_seen and any(_usable(w) >= need and level in w.get("levels", "0123")
                                                for w in idle):
            out.append(task_id)
    return out


def vram_drift(s: Snapshot) -> dict[str, float]:
    """Idle worker -> GB its ledger is off: its free VRAM against its total less the KV reserve
    and its models' footprints, and its claimable VRAM in the idle set against its usable."""
    out = {}
    for w in s.workers:
        if not _idle(w):
            continue
        models = [m for m in w.get("models", "").split(",") if m]
        expected = _usable(w) - sum(s.footprints.get(m, 0.0) for m in models)
        drift = abs(float(w.get("vram_free_gb", 0)) - expected)
        if w["id"] in s.idle_scores:
            drift = max(drift, abs(s.idle_scores[w["id"]] - _usable(w)))
        if drift > DRIFT_GB:
            out[w["id"]] = round(drift, 3)
    return out


def run_counts(s: Snapshot) -> dict[str, int]:
    ends = Counter(r.end or "killed" for r in s.runs)
    return {"endings_read_then_lost": sum(1 for t in s.observed if not s.tasks.get(t)),
            "handler_runs": len(s.runs), "runs_ok": ends["ok"], "runs_yielded": ends["yield"],
            "runs_failed": ends["fail"], "runs_stopped": ends["stop"], "runs_cut_by_kill": ends["killed"],
            "late_acks_rejected": sum(s.rejected.values())}


def check(s: Snapshot) -> dict[str, Any]:
    """Every figure of the report's invariant part; each must be 0 on a sound run."""
    twice = written_twice(s)
    drift = vram_drift(s)
    wrong = wrong_endings(s)
    return {
        "lost_acked_enqueues": len(lost_enqueues(s)),
        "results_written_twice": len(twice),
        "results_without_run": len(orphan_results(s)),
        "runs_beyond_claims": len(runs_beyond_claims(s)),
        "stops_of_held_runs": len(stopped_held(s)),
        "wrong_endings": len(wrong),
        "sla_counts_off": sla_off(s),
        "started_sla_uncounted": len(started_uncounted(s)),
        "stuck_queued_with_idle_fit": len(stuck_queued(s)),
        "vram_drift_workers": len(drift),
        "vram_drift_max_gb": max(drift.values(), default=0.0),
        "leftover_keys": sum(s.leftovers.values()),
        "examples": {"lost": lost_enqueues(s)[:5], "twice": dict(list(twice.items())[:5]),
                     "beyond_claims": runs_beyond_claims(s)[:5], "stopped_held": stopped_held(s)[:5],
                     "wrong_endings": dict(list(wrong.items())[:5]),
                     "sla_uncounted": started_uncounted(s)[:5],
                     "drift": drift, "leftovers": {k: v for k, v in s.leftovers.items() if v}},
    }
