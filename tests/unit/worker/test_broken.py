"""Models whose load failed on a worker (gpuq/worker/broken.py): its claims pass their queues
over for a backoff, and the task whose load failed is passed on; a worker over fakeredis, not
started, whose calls are sent by hand."""

from __future__ import annotations

import logging
import math
import re
import threading
from typing import Any

import fakeredis
import pytest

from gpuq import Config, Queue, State
from gpuq.app import App, Context
from gpuq.clock import server_ms
from gpuq.errors import ConfigError
from gpuq.metrics import WorkerMetrics
from gpuq.worker.broken import Broken
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.loop import Worker
from gpuq.worker.passing import Elsewhere
from gpuq.worker.presence import Presence


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_failed_models_backoff_grows_with_each_failure_and_a_load_resets_it() -> None:
    clock = Clock()
    client = fakeredis.FakeRedis(decode_responses=True)
    models = Broken(Elsewhere(Presence(client, Queue(client, Config(pool="p")).keys, "w")), 30, 600, clock)
    assert models.skipped() == [] and not models.skipping("m") and models.ends_in() == math.inf
    assert models.failed("m") == (1, 30)
    assert models.skipped() == [("m", 30_000)] and models.skipping("m") and models.ends_in() == 30
    clock.now += 30 + 1
    assert models.skipped() == [] and models.failures("m") == 1  # claimed again, failures kept
    assert models.failed("m") == (2, 2 * 30)
    for _ in range(10):
        models.failed("m")
    assert models.failed("m")[1] == 600
    assert models.loaded("m") == 13 and models.failures("m") == 0 and models.skipped() == []
    assert models.failed("m") == (1, 30)


def test_a_workers_load_backoff_follows_its_settings() -> None:
    """Regression: the backoff was fixed at 30 s doubling to 10 min, whatever the settings."""
    worker, _, _, _ = worker_with_a_broken_model(Config(pool="p", load_backoff_s=2, load_backoff_max_s=5))
    assert [worker.executor.broken.failed("bad")[1] for _ in range(3)] == [2, 4, 5]


@pytest.mark.parametrize("env, fragment", [
    ({"GPUQ_LOAD_BACKOFF_S": "60", "GPUQ_LOAD_BACKOFF_MAX_S": "10"},
     "load_backoff_max_s (10.0) must be >= load_backoff_s (60.0)"),
    ({"GPUQ_LOAD_BACKOFF_S": "-1"}, "load_backoff_s must be >= 0, got -1.0"),
    ({"GPUQ_LOAD_BACKOFF_MAX_S": "nan"}, "load_backoff_max_s must be a finite number")])
def test_bad_load_backoff_settings_are_refused_in_one_line(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        Config.from_env(env)


def worker_with_a_broken_model(config: Config | None = None) -> tuple[Worker, Queue, list[str],
                                                                   fakeredis.FakeRedis]:
    """A worker whose loader of model "bad" raises, in a pool where another live worker runs
    the same handler; returns the worker, a queue, the loads tried, the client."""
    client = fakeredis.FakeRedis(decode_responses=True)
    app = App("broken-test")
    loads: list[str] = []

    @app.any_model()
    def load(name: str) -> str:
        loads.append(name)
        if name == "bad":
            raise OSError("weights missing on this host")
        return name

    @app.handler("echo")
    def echo(model: Any, payload: Any, ctx: Context) -> str:
        return str(model)

    config = config or Config(pool="p")
    worker = Worker(client, config, app, GpuInfo("L4", "uuid", 24, None, "declared"), worker_id="w")
    queue = Queue(client, config)
    client.zadd(queue.keys.workers, {"other": server_ms(client) + 600_000})
    client.hset(queue.keys.worker("other"), mapping={"handlers": "echo", "levels": "0123"})
    return worker, queue, loads, client


def claim_and_run(worker: Worker) -> tuple[str, str, list[str]]:
    """Claim one task, run it, send its end: (task id, its model, the end's arguments)."""
    got = worker.claim(None)
    assert isinstance(got, tuple), f"nothing claimed (retry {got})"
    fields, res, running = got[0]
    call = worker.executor.execute(fields, res, running)
    assert call is not None
    worker.settle([call])
    return fields["id"], fields["model"], [call.script, *call.args]


def test_a_claim_passes_over_a_model_whose_load_failed_on_its_worker() -> None:
    """Regression: a failed load failed its task's attempt, and the worker's next claims took
    the same model's tasks and failed their loads too, while other workers could load it."""
    worker, queue, loads, client = worker_with_a_broken_model()
    worker.observer.metrics = metrics = WorkerMetrics("p", "w", "L4")
    clock = Clock()
    worker.executor.broken._clock = clock
    bad1, bad2 = (queue.enqueue("echo", model="bad", vram_gb=4, priority="P2") for _ in range(2))
    good = queue.enqueue("echo", model="good", vram_gb=4, priority="P2")

    task_id, model, end = claim_and_run(worker)
    assert (task_id, model, end[0], end[5]) == (bad1.id, "bad", "fail", "2")  # passed on
    assert "loading model bad failed: OSError: weights missing on this host" in end[4]
    state = client.hmget(queue.keys.task(bad1.id), "state", "attempt")
    assert state == [State.DELAYED.value, "0"]  # its attempt given back
    assert metrics.registry.get_sample_value(
        "gpuq_worker_model_load_failures_total", {"pool": "p", "gpu": "w", "model": "bad"}) == 1

    # bad2 is older than good, but the worker's claims skip "bad" now
    assert claim_and_run(worker)[:2] == (good.id, "good")
    assert worker.claim(None) == 0.0  # nothing else it takes: it waits to be woken
    assert loads == ["bad", "good"]

    clock.now += worker.config.load_backoff_s + 1  # past the backoff: the next load failure spends an attempt
    task_id, model, end = claim_and_run(worker)
    assert (task_id, model, end[0], end[5]) == (bad2.id, "bad", "fail", "1")
    assert client.hget(queue.keys.task(bad2.id), "attempt") == "1"
    assert loads == ["bad", "good", "bad"]


def test_a_task_given_to_a_worker_skipping_its_model_is_passed_on_unloaded() -> None:
    """A hand-over or a reservation brings a task whatever the claim skips: it goes to the
    workers that run its handler without another load here; with none, the load is tried."""
    worker, queue, loads, client = worker_with_a_broken_model()
    worker.executor.broken.failed("bad")
    fields = {"id": "t1", "handler": "echo", "model": "bad", "payload": "1", "vram_gb": "4",
              "attempt": "1", "est_s": "1", "token": "7", "priority": "2"}
    for another_runs_it, mode, tried in ((True, "2", []), (False, "1", ["bad"])):
        if not another_runs_it:
            client.delete(queue.keys.workers)
            worker.executor.elsewhere._known.clear()
        with worker.cache.lock:
            res, running = worker.executor.begin(dict(fields))
        call = worker.executor.execute(fields, res, running)
        assert call is not None and (call.script, call.args[4]) == ("fail", mode)
        assert loads == tried
        assert worker.cache.working_gb == 0 and worker.cache.free_gb() == 19  # nothing kept


def test_a_preload_hint_skips_a_model_whose_load_failed_on_its_worker() -> None:
    """Regression: the reaper's warm hint loaded a model whose loader had just failed here,
    which could evict idle models for it, while this worker's claims skipped it."""
    worker, _, loads, _ = worker_with_a_broken_model()
    clock = Clock()
    worker.executor.broken._clock = clock
    worker.executor.broken.failed("bad")
    control = worker.heartbeat().control
    control.preload("bad", 4)
    assert "bad" not in worker.cache.resident and worker.cache.free_gb() == 19
    clock.now += worker.config.load_backoff_s + 1  # past the backoff: the hint tries the load again
    control.preload("bad", 4)
    for thread in threading.enumerate():
        if thread.name == "preload-bad":
            thread.join(10)
    assert loads == ["bad"] and worker.executor.broken.failures("bad") == 2


def test_a_preload_hint_for_a_model_this_app_cannot_load_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """Regression: a hint for a model of another app's tasks logged "no room" every 30 s on a
    worker with room to spare; it has no loader for it."""
    app = App("named")

    @app.model("mine", vram_gb=4)
    def load(name: str) -> str:
        return name

    client = fakeredis.FakeRedis(decode_responses=True)
    worker = Worker(client, Config(pool="p"), app, GpuInfo("L4", "uuid", 24, None, "declared"),
                    worker_id="w")
    with caplog.at_level(logging.INFO, logger="gpuq"):
        worker.heartbeat().control.preload("elsewhere", 4)
    assert "elsewhere" not in worker.cache.resident and worker.cache.free_gb() == 19
    assert any("model=elsewhere: no loader in app named" in r.getMessage() for r in caplog.records)
