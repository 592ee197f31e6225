"""What the pool sees a worker hold while it loads (gpuq.worker.loading): a
task's load holds its model from its start, a failed one not at all, a preload once loaded.
A worker over fakeredis, not started, its loads run in a thread of the test's."""

from __future__ import annotations

import threading
from typing import Any

import fakeredis
import pytest

from gpuq import Config, Queue
from gpuq.app import App, Context
from gpuq.worker.control import Control
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.loop import Worker


class Loads:
    """A loader that waits for the test's go, then returns or raises."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.go = threading.Event()
        self.fail = False

    def __call__(self, name: str) -> str:
        self.started.set()
        assert self.go.wait(10)
        if self.fail:
            raise OSError("weights missing on this host")
        return name


def worker_and_queue(loads: Loads) -> tuple[Worker, Queue, fakeredis.FakeRedis]:
    client = fakeredis.FakeRedis(decode_responses=True)
    app = App("holding-test")
    app.any_model()(loads)

    @app.handler("echo")
    def echo(model: Any, payload: Any, ctx: Context) -> str:
        return str(model)

    config = Config(pool="p")
    worker = Worker(client, config, app, GpuInfo("L4", "uuid", 24, None, "declared"), worker_id="w")
    return worker, Queue(client, config), client


def seen_holding(q: Queue, client: fakeredis.FakeRedis, model: str) -> tuple[bool, str]:
    """(in the model's holders, the worker hash's `models`)."""
    models = client.hget(q.keys.worker("w"), "models")
    return client.sismember(q.keys.holders(model), "w") == 1, str(models or "")


@pytest.mark.parametrize("fails", [False, True])
def test_a_task_s_load_holds_its_model_from_its_start(fails: bool) -> None:
    """Batch work of the model waits for a loading holder rather than load it elsewhere; a
    failed load leaves the set (reap clears what the hash lists)."""
    loads = Loads()
    loads.fail = fails
    worker, q, client = worker_and_queue(loads)
    q.enqueue("echo", model="m", vram_gb=4, priority="P2")
    got = worker.claim(None)
    assert isinstance(got, tuple)
    fields, res, running = got[0]
    assert res is not None and res.cold
    ran = threading.Thread(target=worker.executor.execute, args=(fields, res, running))
    ran.start()
    try:
        assert loads.started.wait(10)
        assert seen_holding(q, client, "m") == (True, "m")  # while it loads
    finally:
        loads.go.set()
        ran.join(10)
    assert seen_holding(q, client, "m") == ((False, "") if fails else (True, "m"))


def test_a_preload_holds_its_model_once_loaded() -> None:
    """As the replays have it: a warm hint's load is no holder until it ends."""
    loads = Loads()
    worker, q, client = worker_and_queue(loads)
    control = Control(client, q.keys, worker.executor, worker.running, stop_s=1, grace_s=1,
                      stopping=threading.Event(), drain=lambda: None)
    control.preload("m", 4.0)  # starts the load's thread
    assert loads.started.wait(10)
    assert seen_holding(q, client, "m") == (False, "")
    loads.go.set()
    for _ in range(250):  # the load's thread publishes once the load ends
        if seen_holding(q, client, "m")[0]:
            break
        threading.Event().wait(0.02)
    assert seen_holding(q, client, "m") == (True, "m")


def test_a_task_claimed_while_its_model_preloads_is_decided_when_its_handler_starts() -> None:
    """Regression: a worker preloading a model (a warm hint) claimed a task of it as warm:
    began_at and the SLA were written at the claim, and its handler started when the load
    ended (12 s later in a pool run). The claim now says the model is loading: the task
    starts cold, and began.lua decides when the handler starts."""
    loads = Loads()
    worker, q, client = worker_and_queue(loads)
    control = Control(client, q.keys, worker.executor, worker.running, stop_s=1, grace_s=1,
                      stopping=threading.Event(), drain=lambda: None)
    control.preload("m", 4.0)
    assert loads.started.wait(10)
    task = q.enqueue("echo", model="m", vram_gb=4, priority="P0")
    got = worker.claim(None)
    assert isinstance(got, tuple)
    fields, res, running = got[0]
    assert fields["id"] == task.id and fields["sla"] == "pending"
    assert res is not None and not res.cold and res.waits  # loaded by the preload, not this task
    assert client.hmget(q.keys.task(task.id), "loading", "began_at") == ["1", None]
    ran = threading.Thread(target=lambda: worker.settle([worker.executor.execute(fields, res, running)]))
    ran.start()
    threading.Event().wait(0.3)  # the load goes on: the handler has not started
    assert client.hget(q.keys.task(task.id), "began_at") is None
    loads.go.set()
    ran.join(10)
    began_at, started_at = (int(v) for v in client.hmget(q.keys.task(task.id), "began_at", "started_at"))
    assert began_at >= started_at + 300  # ms: at the handler's start, past the load
    assert client.hget(q.keys.task(task.id), "loading") == ""
    (miss,) = client.lrange(q.keys.sla_misses, 0, -1)
    assert '"kind":"cold"' in miss.replace(" ", "")  # its load came first: a cold miss
