"""The chaos soak's checker on fabricated snapshots: it passes a sound run and fails each
invariant when the data shows it broken (a lost task, a double write seen by each witness,
a stuck task, ledger drift, leftover keys, attempts past the bound, SLA counts off)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from chaos.checker import Run, Snapshot, check, parse_runs  # noqa: E402
from chaos.report import invariants_ok, table  # noqa: E402

IDLE_WORKER = {"id": "w1", "state": "idle", "running": "0", "vram_total_gb": "48",
               "kv_reserve_gb": "5", "models": "m-small", "vram_free_gb": "39", "levels": "0123"}


def succeeded(run: str, attempt: int = 1) -> dict[str, str]:
    return {"state": "succeeded", "result": json.dumps({"run": run}), "vram_gb": "4", "priority": "2",
            "attempt": str(attempt), "began_at": "1000"}


def sound() -> Snapshot:
    """Two tasks: t1 ran once; t2 ran on w1, lost its lease (rejected late ack), ran on w2."""
    return Snapshot(
        acked={"t1": "sync", "t2": "bulk"},
        tasks={"t1": succeeded("r1"), "t2": succeeded("r3", attempt=2)},
        done_len={"t1": 1, "t2": 1},
        observed={"t1": ("succeeded", "r1"), "t2": ("succeeded", "r3")},
        runs=[Run("t1", 1, "w1", "r1", "ok"), Run("t2", 1, "w1", "r2", "ok", lost=True),
              Run("t2", 2, "w2", "r3", "ok")],
        rejected=Counter({("t2", "w1"): 1}),
        workers=[IDLE_WORKER], idle_scores={"w1": 43.0}, footprints={"m-small": 4.0},
        leftovers={"running": 0, "leases": 0}, sla_counted=2)


def test_a_sound_run_passes() -> None:
    figures = check(sound())
    assert figures["lost_acked_enqueues"] == 0
    assert figures["results_written_twice"] == 0
    assert figures["vram_drift_workers"] == 0
    assert invariants_ok(figures)
    assert "all hold" in table({**figures, "seed": 1, "fsync": "always"})


def test_a_lost_task_fails() -> None:
    snap = sound()
    del snap.tasks["t2"]  # acknowledged, gone from Redis
    snap.acked["t3"] = "async"
    snap.tasks["t3"] = {"state": "running", "vram_gb": "4", "priority": "2"}  # never ended
    figures = check(snap)
    assert figures["lost_acked_enqueues"] == 2
    assert not invariants_ok(figures)
    assert "VIOLATED" in table({**figures, "seed": 1, "fsync": "always"})


def test_a_task_ended_twice_in_redis_fails() -> None:
    snap = sound()
    snap.done_len["t1"] = 2
    figures = check(snap)
    assert figures["results_written_twice"] == 1
    assert figures["examples"]["twice"] == {"t1": ["redis"]}


def test_an_ending_a_client_read_that_changed_fails() -> None:
    snap = sound()
    snap.observed["t2"] = ("succeeded", "r2")  # a client read r2's result; r3's is final
    assert check(snap)["examples"]["twice"] == {"t2": ["client"]}


@pytest.mark.parametrize("explained", [False, True])
def test_a_second_accepted_result_in_the_run_logs_fails_unless_rejected(explained: bool) -> None:
    snap = sound()
    snap.rejected = Counter({("t2", "w1"): 1}) if explained else Counter()
    figures = check(snap)
    assert figures["results_written_twice"] == (0 if explained else 1)


def test_a_killed_worker_s_result_is_not_counted() -> None:
    snap = sound()
    snap.rejected = Counter()
    snap.killed = {"w1"}  # its ack may or may not have gone out before the kill
    assert check(snap)["results_written_twice"] == 0


def test_one_rejection_explains_one_run_only() -> None:
    snap = sound()
    snap.runs.append(Run("t2", 2, "w1", "r4", "ok"))  # a second success on w1, one rejection
    assert check(snap)["results_written_twice"] == 1


def test_a_result_from_no_logged_run_fails() -> None:
    snap = sound()
    snap.tasks["t1"] = succeeded("nowhere")
    snap.observed["t1"] = ("succeeded", "nowhere")
    assert check(snap)["results_without_run"] == 1


def test_a_task_queued_while_an_idle_worker_fits_it_is_stuck() -> None:
    snap = sound()
    snap.acked["t3"] = "sync"
    snap.tasks["t3"] = {"state": "queued", "vram_gb": "40", "priority": "2"}
    assert check(snap)["stuck_queued_with_idle_fit"] == 1
    snap.tasks["t3"]["vram_gb"] = "60"  # fits no worker: lost, not stuck
    figures = check(snap)
    assert (figures["stuck_queued_with_idle_fit"], figures["lost_acked_enqueues"]) == (0, 1)


def test_ledger_drift_on_an_idle_worker_fails() -> None:
    snap = sound()
    snap.workers = [{**IDLE_WORKER, "vram_free_gb": "35"}]  # 4 GB missing from the ledger
    assert check(snap)["vram_drift_workers"] == 1
    assert check(snap)["vram_drift_max_gb"] == 4.0
    snap.workers = [IDLE_WORKER]
    snap.idle_scores = {"w1": 40.0}  # claims see less than the idle GPU has
    assert check(snap)["vram_drift_workers"] == 1


def test_leftover_keys_fail() -> None:
    snap = sound()
    snap.leftovers["holders"] = 2
    figures = check(snap)
    assert figures["leftover_keys"] == 2
    assert not invariants_ok(figures)


def test_run_logs_join_starts_and_ends() -> None:
    runs = parse_runs(["start t1 1 w1 r1", "ok t1 1 w1 r1 0", "start t2 1 w2 r2",
                       "start t3 2 w2 r3", "yield t3 2 w2 r3 1", "ok t4 1"])
    assert sorted((r.run, r.end, r.lost) for r in runs) == [
        ("r1", "ok", False), ("r2", "", False), ("r3", "yield", True)]


def test_a_task_noted_stuck_during_the_run_fails_once() -> None:
    snap = sound()
    snap.stuck_seen = {"t1"}  # it ended later, but waited with an idle worker fitting it
    assert check(snap)["stuck_queued_with_idle_fit"] == 1


def test_a_run_without_a_claim_of_its_own_fails() -> None:
    snap = sound()
    snap.runs.append(Run("t1", 1, "w2", "r9", "yield"))  # a second run of attempt 1 ...
    assert check(snap)["runs_beyond_claims"] == 1
    snap.tasks["t1"]["preemptions"] = "1"  # ... is sound when the first gave its attempt back
    assert check(snap)["runs_beyond_claims"] == 0


def test_an_ending_read_of_a_task_since_gone_is_a_lost_enqueue() -> None:
    snap = sound()
    del snap.tasks["t1"]
    figures = check(snap)
    assert (figures["lost_acked_enqueues"], figures["results_written_twice"]) == (1, 0)


def chaos_task(state: str, kind: str = "run", **more: str) -> dict[str, str]:
    return {"state": state, "payload": json.dumps({"kind": kind, "s": 0.1}), "vram_gb": "4",
            "priority": "2", "attempt": "1", "max_attempts": "6", **more}


@pytest.mark.parametrize(("fields", "cancel", "wrong"), [
    (chaos_task("canceled"), "running", False),  # a cancel found it running
    (chaos_task("canceled"), "unknown", False),  # the cancel's call failed, maybe applied
    (chaos_task("canceled"), None, True),  # nobody canceled it
    (chaos_task("succeeded"), "queued", True),  # a cancel took, the task ran on
    (chaos_task("succeeded"), "already succeeded", False),
    (chaos_task("canceled"), "already succeeded", True),  # an ending that changed
    (chaos_task("expired", deadline="1000"), None, False),  # e.g. on its way back to its queue
    (chaos_task("expired"), None, True),  # no deadline to miss
    (chaos_task("failed", "fail_always", attempt="6"), None, False),
    (chaos_task("failed", "run", attempt="6"), None, False),  # attempts spent on lost leases
    (chaos_task("failed", "fail_once", attempt="1"), None, True),  # a retryable failure, not retried
    (chaos_task("succeeded", "fail_always", attempt="6"), None, True),
    (chaos_task("succeeded", "timeout_always", attempt="6"), None, True),
    (chaos_task("failed", "timeout_always", attempt="6"), None, False),
    (chaos_task("succeeded", "timeout_once", attempt="2"), None, False),
    (chaos_task("failed", "run", attempt="7"), None, True),  # past max_attempts
])
def test_a_task_that_ended_other_than_it_should_fails(fields: dict[str, str], cancel: str | None,
                                                       wrong: bool) -> None:
    snap = sound()
    snap.acked["t3"] = "sync"
    snap.tasks["t3"] = fields
    if cancel is not None:
        snap.cancels["t3"] = cancel
    figures = check(snap)
    assert figures["wrong_endings"] == int(wrong)
    if wrong:
        assert not invariants_ok(figures)


def test_sla_counted_twice_or_not_at_all_fails() -> None:
    snap = sound()
    snap.sla_counted = 3  # one task counted twice
    assert check(snap)["sla_counts_off"] == 1
    snap = sound()
    del snap.tasks["t1"]["began_at"]  # its handler ran (r1), its SLA never decided
    snap.sla_counted = 1
    figures = check(snap)
    assert (figures["sla_counts_off"], figures["started_sla_uncounted"]) == (0, 1)
    assert not invariants_ok(figures)
    snap.sla_unreported = {"t1"}  # its began failed with Redis away: uncounted by design
    assert check(snap)["started_sla_uncounted"] == 0
    snap = sound()
    del snap.tasks["t1"]["began_at"]  # it expired before it ever started: a miss counted
    snap.tasks["t1"]["state"] = "expired"
    assert check(snap)["sla_counts_off"] == 0


def test_a_warm_hand_over_taken_back_after_its_handler_started_is_no_run_beyond_claims() -> None:
    snap = sound()
    snap.runs.append(Run("t1", 1, "w2", "r9", "ok", lost=True))  # attempt 1 again, on w2
    snap.rejected[("t1", "w2")] += 1  # its result discarded
    assert check(snap)["runs_beyond_claims"] == 1
    snap.taken_back["t1"] += 1  # w2's began found the hand-over taken back
    assert check(snap)["runs_beyond_claims"] == 0


def test_a_run_stopped_by_force_while_still_its_workers_fails() -> None:
    snap = sound()
    snap.tasks["t1"]["preemptions"] = "1"
    snap.runs.append(Run("t1", 1, "w2", "r9", "stop", lost=True))  # requeued, then stopped
    assert check(snap)["stops_of_held_runs"] == 0
    snap.runs.append(Run("t1", 1, "w2", "r8", "stop", lost=False))  # stopped, never given up
    figures = check(snap)
    assert (figures["stops_of_held_runs"], figures["examples"]["stopped_held"]) == (1, ["t1"])
    assert not invariants_ok(figures)


def test_a_result_from_a_run_stopped_by_force_fails() -> None:
    snap = sound()  # r1 swallowed its stop and returned: its result must have been discarded
    snap.runs[0] = Run("t1", 1, "w1", "r1", "stop", lost=True)
    assert check(snap)["results_without_run"] == 1


def test_a_task_its_worker_gave_back_as_it_exited_stuck_is_no_run_beyond_claims() -> None:
    snap = sound()
    snap.runs.append(Run("t1", 1, "w2", "r9"))  # cut by w2's exit; its attempt given back
    assert check(snap)["runs_beyond_claims"] == 1
    snap.given_back["t1"] += 1  # w2 logged task.requeued ... reason=stuck
    assert check(snap)["runs_beyond_claims"] == 0


def test_a_hand_over_canceled_before_its_began_landed_needs_no_sla() -> None:
    snap = sound()
    del snap.tasks["t1"]["began_at"]  # its handler ran (r1); a cancel came before its began
    snap.tasks["t1"]["state"] = "canceled"
    snap.sla_counted = 1
    assert check(snap)["started_sla_uncounted"] == 1
    snap.taken_back["t1"] += 1  # began found it taken back: no start the server saw
    assert check(snap)["started_sla_uncounted"] == 0
    snap.runs.append(Run("t1", 2, "w2", "r9", "ok"))  # but a later run of it went uncounted
    assert check(snap)["started_sla_uncounted"] == 1
