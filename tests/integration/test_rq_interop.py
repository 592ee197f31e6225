"""RQ interop end to end: a plain RQ producer, a real bridge and a real gpuq worker process.

RQ's own keys span hash slots, so RQ cannot run on Redis Cluster: these tests skip there.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from procs import ROOT, SIM_APP, Proc, Procs, wait_for

from gpuq import Queue
from gpuq.embedded import EmbeddedServer
from gpuq.task import ended_count

rq = pytest.importorskip("rq")


def notes(text: str) -> Any:
    """A tests.rq_jobs.Notes, by the class path the worker imports (the tests' directory is
    this process's import path, not the repository's root)."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    return importlib.import_module("tests.rq_jobs").Notes(text)

pytestmark = [
    pytest.mark.skipif(os.environ.get("GPUQ_TEST_CLUSTER", "") == "1",
                       reason="RQ does not run on Redis Cluster (its keys span hash slots)"),
]
GPU = {"model": "llama3-8b", "vram_gb": 16, "priority": "online", "est_s": 0.1}


@pytest.fixture
def rq_redis(redis_server: EmbeddedServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)  # RQ reads bytes
    yield client
    client.close()


@pytest.fixture
def rq_queue(rq_redis: redis.Redis, pool: str) -> rq.Queue:
    return rq.Queue(f"gpu-{pool}", connection=rq_redis)  # RQ's keys are global: one per test


def bridge(procs: Procs, queue: rq.Queue, *args: str, env: dict[str, str] | None = None) -> Proc:
    return procs.start("bridge", ["rq-bridge", "--rq-queue", queue.name, *args], env)


def run_bridge(procs: Procs, queue: rq.Queue, *args: str) -> Proc:
    proc = bridge(procs, queue, "--burst", *args)
    assert proc.wait() == 0, proc.log()
    return proc


def run_worker(procs: Procs, *allow: str) -> Proc:
    args = ["worker", "--app", SIM_APP, "--vram-gb", "24", "--name", "w1", "--burst"]
    for module in allow or ("tests.rq_jobs",):
        args += ["--rq-allow", module]
    proc = procs.start("w1", args)
    assert proc.wait(30) == 0, proc.log()
    return proc


def failure_text(job: rq.job.Job) -> str:
    result = job.latest_result()
    assert result is not None and result.type == result.Type.FAILED, result
    return str(result.exc_string)


@pytest.mark.slow
def test_rq_producer_jobs_run_on_a_gpuq_worker_and_results_come_back_in_rq_format(
        procs: Procs, rq_queue: rq.Queue) -> None:
    ok = rq_queue.enqueue("tests.rq_jobs.add", 2, 3, meta={"gpuq": GPU})
    model = rq_queue.enqueue("tests.rq_jobs.which_model", meta={"gpuq": {**GPU, "model": "m7"}})
    bad = rq_queue.enqueue("tests.rq_jobs.boom", "out of tokens", meta={"gpuq": GPU})
    defaulted = rq_queue.enqueue("tests.rq_jobs.add", 1, 1)  # no meta: the bridge's defaults
    proc = run_bridge(procs, rq_queue, "--model", "llama3-8b", "--vram-gb", "16")
    assert "4 delivered, 0 refused" in proc.log()
    assert rq_queue.count == 0 and ok.get_status() == "queued"
    run_worker(procs)

    assert ok.latest_result(timeout=10).return_value == 5
    assert ok.return_value() == 5 and ok.get_status() == "finished"
    assert defaulted.return_value() == 2
    seen = model.latest_result(timeout=10).return_value
    assert seen["model"] == "m7" and seen["job"] == model.id and seen["task"].startswith("rq-")
    assert ok.id in rq_queue.finished_job_registry.get_job_ids()
    assert bad.get_status() == "failed" and bad.id in rq_queue.failed_job_registry.get_job_ids()
    assert "ValueError: out of tokens" in failure_text(bad)
    assert bad.id not in rq_queue.finished_job_registry.get_job_ids()


# an in-process bridge, not slow: it also runs (and shows its skip) in the cluster pass
def test_jobs_without_gpu_fields_or_with_bad_ones_are_failed_in_rq_with_the_reason(
        real_queue: Queue, rq_redis: redis.Redis, rq_queue: rq.Queue, redis_server: EmbeddedServer) -> None:
    from gpuq.rq.bridge import Bridge

    bare = rq_queue.enqueue("tests.rq_jobs.add", 1, 2)
    negative = rq_queue.enqueue("tests.rq_jobs.add", 1, 2, meta={"gpuq": {**GPU, "vram_gb": -1}})
    bridge = Bridge(real_queue, rq_redis, redis_server.url, [rq_queue.name], {}, burst=True)
    assert bridge.run() == 0
    assert (bridge.delivered, bridge.refused) == (0, 2)
    assert real_queue.redis.hget(real_queue.keys.stats, "enqueued") is None
    assert bare.get_status() == "failed" and negative.get_status() == "failed"
    assert "no model or vram_gb" in failure_text(bare)
    assert "vram_gb must be a finite number > 0 and at most 1e6, got -1" in failure_text(negative)
    assert set(rq_queue.failed_job_registry.get_job_ids()) == {bare.id, negative.id}


class Touch:
    """A forged argument: unpickling it with pickle.loads would create the file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.path}",)


@pytest.mark.slow
def test_functions_outside_the_allowlist_and_forged_pickles_are_refused_and_run_nothing(
        procs: Procs, rq_queue: rq.Queue, tmp_path: Path) -> None:
    marker, forged_marker = tmp_path / "system-ran", tmp_path / "forged-ran"
    system = rq_queue.enqueue("os.system", f"touch {marker}", meta={"gpuq": GPU})
    forged = rq_queue.enqueue("tests.rq_jobs.add", Touch(forged_marker), 1, meta={"gpuq": GPU})
    sibling = rq_queue.enqueue("tests.rq_jobs_other.add", 1, 1, meta={"gpuq": GPU})
    # found by a security review: a method its allowed class inherits from outside the allowlist
    # (pathlib's write_text on a subclass wrote a file); its own method runs
    inherited = rq_queue.enqueue(notes("$x").substitute, x=1, meta={"gpuq": GPU})
    own = rq_queue.enqueue(notes("ab").count, meta={"gpuq": GPU})
    run_bridge(procs, rq_queue)
    run_worker(procs)
    assert not marker.exists() and not forged_marker.exists()
    assert own.get_status() == "finished" and own.return_value() == 2
    assert "method substitute of tests.rq_jobs.Notes is defined outside the worker's rq allowlist" in \
        failure_text(inherited)
    for job in (system, forged, sibling, inherited):
        assert job.get_status() == "failed", job.id
    assert "function os.system is not in the worker's rq allowlist" in failure_text(system)
    assert "names posix.system, which is not in the worker's rq allowlist" in failure_text(forged)
    assert "tests.rq_jobs_other.add is not in the worker's rq allowlist" in failure_text(sibling)
    for job in (system, forged, sibling):  # refused once: no retry
        assert procs.record(f"rq-{job.id}-{int(job.enqueued_at.timestamp() * 1000)}").attempt == 1


@pytest.mark.slow
@pytest.mark.parametrize("step", ["taken", "enqueued"])
def test_a_bridge_killed_mid_move_loses_nothing_and_delivers_once(
        procs: Procs, rq_queue: rq.Queue, rq_redis: redis.Redis, step: str) -> None:
    job = rq_queue.enqueue("tests.rq_jobs.add", 20, 22, meta={"gpuq": GPU})
    taken = procs.keys.rq_taken(rq_queue.name)
    first = bridge(procs, rq_queue, env={"GPUQ_RQ_BRIDGE_PAUSE": f"{step}:60"})
    wait_for(lambda: "rq.paused" in first.log(), 15, message=lambda: first.log())
    first.signal(signal.SIGKILL)
    first.wait()
    assert rq_queue.count == 0 and rq_redis.lrange(taken, 0, -1) == [job.id.encode()]
    enqueued = int(procs.redis.hget(procs.keys.stats, "enqueued") or 0)
    assert enqueued == (1 if step == "enqueued" else 0)

    second = run_bridge(procs, rq_queue)
    assert "rq.recovered" in second.log()
    assert rq_redis.llen(taken) == 0
    run_worker(procs)
    assert job.latest_result(timeout=10).return_value == 42
    assert len(job.results()) == 1  # ran once
    assert int(procs.redis.hget(procs.keys.stats, "enqueued") or 0) == 1
    assert ended_count(procs.redis.hgetall(procs.keys.stats), "succeeded") == 1


@pytest.mark.slow
def test_gpuq_retries_an_rq_job_and_rq_sees_only_the_last_failure(
        procs: Procs, rq_queue: rq.Queue) -> None:
    job = rq_queue.enqueue("tests.rq_jobs.boom", "again", meta={"gpuq": {**GPU, "max_attempts": 2}},
                           retry=rq.Retry(max=1))
    run_bridge(procs, rq_queue)
    task_id = f"rq-{job.id}-{int(job.enqueued_at.timestamp() * 1000)}"
    run_worker(procs)  # a burst worker leaves the retry waiting out its backoff
    assert (procs.record(task_id).state.value, procs.record(task_id).attempt) == ("delayed", 1)
    assert job.get_status() == "queued" and job.results() == []
    job.refresh()
    assert job.retries_left == 0  # a retry spent, as RQ counts its own
    def backoff_over() -> bool:
        seconds, micros = procs.redis.time()
        ready = procs.redis.zscore(procs.keys.delayed, task_id)
        return ready is not None and ready <= seconds * 1000 + micros // 1000

    wait_for(backoff_over, 5, message="the retry's backoff to pass")
    run_worker(procs)
    assert job.get_status() == "failed"
    assert len(job.results()) == 1 and "ValueError: again" in failure_text(job)
    assert (procs.record(task_id).state.value, procs.record(task_id).attempt) == ("failed", 2)


def test_tasks_that_end_without_their_handler_end_their_rq_jobs_too(
        real_queue: Queue, rq_redis: redis.Redis, rq_queue: rq.Queue, redis_server: EmbeddedServer) -> None:
    """Canceled in gpuq -> canceled in RQ; failed where no handler ran (a worker without
    --rq-allow) -> failed in RQ with gpuq's reason; an end RQ already shows is left alone."""
    from gpuq import State, testing
    from gpuq.rq.bridge import Bridge
    from gpuq.rq.fields import task_id_for
    from workers.sim import app as sim_app

    canceled = rq_queue.enqueue("tests.rq_jobs.add", 1, 2, meta={"gpuq": GPU})
    refused = rq_queue.enqueue("tests.rq_jobs.add", 3, 4, meta={"gpuq": {**GPU, "priority": "batch"}})
    bridge = Bridge(real_queue, rq_redis, redis_server.url, [rq_queue.name], {}, burst=True)
    assert bridge.run() == 0 and bridge.delivered == 2
    tasks = {job.id: task_id_for(job.id, rq.job.Job.fetch(job.id, connection=rq_redis).enqueued_at)
             for job in (canceled, refused)}
    real_queue.cancel(tasks[canceled.id])
    # a worker app without the rq handler: the task fails at once, no handler ran
    testing.drain(real_queue, sim_app, vram_gb=24)
    assert real_queue.record(tasks[refused.id]).state is State.FAILED
    assert refused.get_status() == "queued"  # nobody has told RQ yet
    assert real_queue.redis.llen(real_queue.keys.ended) == 2

    assert bridge.run() == 0
    assert canceled.get_status() == "canceled"
    assert canceled.id in rq_queue.canceled_job_registry.get_job_ids()
    assert refused.get_status() == "failed" and refused.id in rq_queue.failed_job_registry.get_job_ids()
    assert "handler 'rq.job' is not registered" in failure_text(refused)
    assert real_queue.redis.llen(real_queue.keys.ended) == 0
    # reported once: a second pass finds nothing and changes nothing
    real_queue.redis.lpush(real_queue.keys.ended, tasks[refused.id])
    assert bridge.run() == 0
    assert len(rq_queue.failed_job_registry.get_job_ids()) == 1
    assert real_queue.redis.llen(real_queue.keys.ended) == 0


def rq_app(real_queue: Queue, rq_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An app with a loader for any model and the rq handler, allowing tests.rq_jobs (the
    repository's root on the path, as a worker started there has it)."""
    from gpuq import App

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    from gpuq.rq.handler import install
    from gpuq.rq.unpickle import Allowlist

    app = App("rq-test")

    @app.any_model()
    def load(name: str) -> str:
        return name

    install(app, Allowlist(["tests.rq_jobs"]), rq_redis, real_queue.redis, real_queue.keys)
    return app


def test_a_damaged_rq_job_is_dropped_and_the_bridge_goes_on(
        real_queue: Queue, rq_redis: redis.Redis, rq_queue: rq.Queue, redis_server: EmbeddedServer) -> None:
    """Regression: a job hash RQ itself cannot read (a bad status, date or count) raised out
    of the bridge; its id stayed in the taken list, so every restart died on it first."""
    from gpuq.rq.bridge import Bridge

    bad = rq_queue.enqueue("tests.rq_jobs.add", 1, 2, meta={"gpuq": GPU})
    rq_redis.hset(bad.key, "status", "bogus")
    good = rq_queue.enqueue("tests.rq_jobs.add", 3, 4, meta={"gpuq": GPU})
    for _ in range(2):
        bridge = Bridge(real_queue, rq_redis, redis_server.url, [rq_queue.name], {}, burst=True)
        assert bridge.run() == 0
    assert real_queue.redis.hget(real_queue.keys.stats, "enqueued") == "1"  # the good one
    assert rq_redis.llen(real_queue.keys.rq_taken(rq_queue.name)) == 0
    assert good.get_status() == "queued"


def test_jobs_canceled_in_rq_or_calling_sys_exit_end_as_rq_would(
        real_queue: Queue, rq_redis: redis.Redis, rq_queue: rq.Queue, redis_server: EmbeddedServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Regressions: a job canceled through RQ's API after the bridge moved it still ran and
    was marked finished; a job calling sys.exit() ended the runner (the worker wedged, the
    job left started)."""
    from gpuq import State, testing
    from gpuq.rq.bridge import Bridge
    from gpuq.rq.fields import task_id_for

    canceled = rq_queue.enqueue("tests.rq_jobs.add", 1, 2, meta={"gpuq": GPU})
    leaving = rq_queue.enqueue("tests.rq_jobs.leave", meta={"gpuq": GPU})
    after = rq_queue.enqueue("tests.rq_jobs.add", 5, 6, meta={"gpuq": GPU})
    assert Bridge(real_queue, rq_redis, redis_server.url, [rq_queue.name], {}, burst=True).run() == 0
    rq.job.Job.fetch(canceled.id, connection=rq_redis).cancel()
    assert testing.drain(real_queue, rq_app(real_queue, rq_redis, monkeypatch), vram_gb=24) == 3
    task = task_id_for(canceled.id, rq.job.Job.fetch(canceled.id, connection=rq_redis).enqueued_at)
    record = real_queue.record(task)
    assert record.state is State.FAILED and "canceled in RQ" in (record.error or "")
    assert canceled.get_status() == "canceled"
    assert canceled.id not in rq_queue.finished_job_registry.get_job_ids()
    assert leaving.get_status() == "failed" and "SystemExit" in failure_text(leaving)
    assert after.return_value() == 11


def test_a_job_keeping_no_result_still_releases_its_dependents(
        real_queue: Queue, rq_redis: redis.Redis, rq_queue: rq.Queue, redis_server: EmbeddedServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: with result_ttl=0 the job's cleanup deleted its dependents before they
    were enqueued: the child stayed deferred, where RQ's own worker runs it."""
    from gpuq import testing
    from gpuq.rq.bridge import Bridge

    parent = rq_queue.enqueue("tests.rq_jobs.add", 1, 2, meta={"gpuq": GPU}, result_ttl=0)
    child = rq_queue.enqueue("tests.rq_jobs.add", 2, 2, meta={"gpuq": GPU}, depends_on=parent)
    app = rq_app(real_queue, rq_redis, monkeypatch)
    for _ in range(2):  # the parent, then its released child
        assert Bridge(real_queue, rq_redis, redis_server.url, [rq_queue.name], {}, burst=True).run() == 0
        testing.drain(real_queue, app, vram_gb=24)
    assert child.get_status() == "finished" and child.return_value() == 4


@pytest.mark.slow
def test_a_bridge_stopped_with_sigterm_exits_0_with_its_summary(procs: Procs, rq_queue: rq.Queue) -> None:
    """The defect: SIGTERM (how Docker and Kubernetes stop it) killed the bridge without the
    summary line its docs promise, exit -15; Ctrl-C printed it."""
    rq_queue.enqueue("tests.rq_jobs.add", 2, 3, meta={"gpuq": GPU})
    proc = bridge(procs, rq_queue)  # not --burst: it blocks on the empty queue after the move
    wait_for(lambda: "rq.delivered" in proc.log(), 15, 0.05, "the job to move")
    proc.terminate()
    assert proc.wait(10) == 0, proc.log()
    assert "rq-bridge: 1 delivered, 0 refused" in proc.log()


def test_an_end_reported_late_leaves_a_job_enqueued_again_since_alone(
        real_queue: Queue, rq_redis: redis.Redis, rq_queue: rq.Queue, redis_server: EmbeddedServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a job requeued from RQ's failed registry before the bridge's next pass was
    marked failed again with the earlier task's end (a second failed Result, status failed
    while its new task waited to run): the end belonged to an earlier enqueue."""
    from gpuq import testing
    from gpuq.rq.bridge import Bridge

    job = rq_queue.enqueue("tests.rq_jobs.boom", "first run", meta={"gpuq": GPU})
    bridge = Bridge(real_queue, rq_redis, redis_server.url, [rq_queue.name], {}, burst=True)
    assert bridge.run() == 0 and bridge.delivered == 1
    testing.drain(real_queue, rq_app(real_queue, rq_redis, monkeypatch), vram_gb=24)
    assert job.get_status() == "failed" and len(job.results()) == 1
    assert real_queue.redis.llen(real_queue.keys.ended) == 1  # not yet seen by a bridge
    rq_queue.failed_job_registry.requeue(job.id)  # the producer runs it again
    assert bridge.run() == 0 and bridge.delivered == 2  # the new enqueue is a new task
    assert job.get_status() == "queued" and len(job.results()) == 1
    assert real_queue.redis.llen(real_queue.keys.ended) == 0


def test_a_job_whose_worker_died_shows_queued_again_in_rq(
        real_queue: Queue, rq_redis: redis.Redis, rq_queue: rq.Queue, redis_server: EmbeddedServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a worker killed mid-job with attempts left: the reaper put the task back
    in its queue, but RQ showed the job `started` by the dead worker for good (only a
    handler wrote RQ's status, and the dead one could not)."""
    from gpuq import State
    from gpuq.claims import ClaimRequest
    from gpuq.rq import outcome
    from gpuq.rq.bridge import Bridge
    from gpuq.rq.fields import task_id_for

    job = rq_queue.enqueue("tests.rq_jobs.add", 1, 2, meta={"gpuq": GPU}, retry=rq.Retry(max=1))
    bridge = Bridge(real_queue, rq_redis, redis_server.url, [rq_queue.name], {}, burst=True)
    assert bridge.run() == 0 and bridge.delivered == 1
    task_id = task_id_for(job.id, rq.job.Job.fetch(job.id, connection=rq_redis).enqueued_at)
    # a worker claims it and its handler tells RQ it started; then the worker dies
    claim = real_queue.calls.claim(ClaimRequest("w-dead", 24.0, 0.0, 1, [("llama3-8b", 16.0)]))
    assert real_queue.scripts.run(claim).task["id"] == task_id
    outcome.started(rq.job.Job.fetch(job.id, connection=rq_redis), "w-dead")
    assert job.get_status() == "started"
    real_queue.redis.zadd(real_queue.keys.workers, {"w-dead": 1})  # its liveness long past
    assert real_queue.scripts.run(real_queue.calls.reap()).requeued == 1
    assert real_queue.record(task_id).state is State.QUEUED
    assert bridge.run() == 0
    assert job.get_status() == "queued" and job.results() == []
    assert real_queue.redis.llen(real_queue.keys.ended) == 0
    # a run that started since reports for itself: the bridge leaves its started alone
    claim = real_queue.calls.claim(ClaimRequest("w2", 24.0, 0.0, 1, [("llama3-8b", 16.0)]))
    assert real_queue.scripts.run(claim).task["id"] == task_id
    outcome.started(rq.job.Job.fetch(job.id, connection=rq_redis), "w2")
    real_queue.redis.lpush(real_queue.keys.ended, task_id)
    assert bridge.run() == 0
    assert job.get_status() == "started"


@pytest.mark.parametrize("stop", [False, True], ids=["returned", "stopped"])
def test_a_job_canceled_in_gpuq_while_it_runs_ends_canceled_in_rq(
        real_queue: Queue, rq_redis: redis.Redis, rq_queue: rq.Queue, redis_server: EmbeddedServer,
        monkeypatch: pytest.MonkeyPatch, stop: bool) -> None:
    """Found by a QA pass: `gpuq cancel` of a running RQ job left RQ showing it `queued` for
    good once its worker stopped the run (the stop was taken for a yield), or `finished`
    with a result when the job returned within the grace (the worker discarded it)."""
    from gpuq import testing
    from gpuq.rq.bridge import Bridge

    job = rq_queue.enqueue("tests.rq_jobs.canceled_while_running", stop, meta={"gpuq": GPU})
    bridge = Bridge(real_queue, rq_redis, redis_server.url, [rq_queue.name], {}, burst=True)
    assert bridge.run() == 0 and bridge.delivered == 1
    app = rq_app(real_queue, rq_redis, monkeypatch)  # puts the repository on the path

    def cancel(task_id: str) -> None:  # as an operator would, the bridge telling RQ at once
        real_queue.cancel(task_id)
        assert bridge.run() == 0 and job.get_status() == "canceled"

    monkeypatch.setattr("tests.rq_jobs.on_cancel", [cancel])
    testing.drain(real_queue, app, vram_gb=24)
    assert bridge.run() == 0
    assert job.get_status() == "canceled", job.get_status()
    assert job.id not in rq_queue.finished_job_registry.get_job_ids() and job.latest_result() is None


def test_a_bridge_whose_connections_are_killed_waits_and_goes_on(
        procs: Procs, rq_queue: rq.Queue, rq_redis: redis.Redis) -> None:
    """Found by a QA pass: `CLIENT KILL TYPE normal` (a failover, a proxy's restart) ended the
    bridge with exit 5, no summary; jobs then waited in RQ until someone restarted it. It
    now logs the outage, waits it out and moves the next job."""
    rq_queue.enqueue("tests.rq_jobs.add", 2, 3, meta={"gpuq": GPU})
    proc = bridge(procs, rq_queue)
    wait_for(lambda: "rq.delivered" in proc.log(), 15, 0.05, "the first job to move")
    time.sleep(0.3)  # blocked on the empty queue
    blocked = [c["id"] for c in rq_redis.client_list() if c.get("cmd") == "blmove"]  # the bridge's
    assert blocked, rq_redis.client_list()
    for client_id in blocked:
        rq_redis.client_kill_filter(_id=client_id)
    time.sleep(0.5)
    rq_queue.enqueue("tests.rq_jobs.add", 4, 5, meta={"gpuq": GPU})
    wait_for(lambda: proc.log().count("rq.delivered") == 2, 15, 0.05, "the second job to move")
    assert proc.alive(), proc.log()
    proc.terminate()
    assert proc.wait(10) == 0 and "rq-bridge: 2 delivered, 0 refused" in proc.log(), proc.log()


def test_a_worker_whose_rq_redis_is_unreachable_exits_at_start(procs: Procs) -> None:
    """Found by a QA pass: `--rq-redis` naming a dead server started the worker (exit 0), and
    every RQ job then failed with a ConnectionError, using up its attempts; the bridge given
    the same URL exits 5 at start."""
    proc = procs.start("w1", ["worker", "--app", SIM_APP, "--vram-gb", "24", "--rq-allow", "tests.rq_jobs",
                              "--rq-redis", "redis://127.0.0.1:1/0"])
    assert proc.wait(30) == 5, proc.log()
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in proc.log()
