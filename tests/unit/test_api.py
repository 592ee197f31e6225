"""The producer API says what it takes: the sync and asyncio clients have one surface, the
enqueue options are TaskSpec's, and both close what they opened."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, get_type_hints

import fakeredis
import pytest

from gpuq.aio import AsyncQueue, AsyncTask
from gpuq.cli import cli
from gpuq.client import Queue, Task
from gpuq.config import Config
from gpuq.errors import InvalidTask, NotRequeueable, TaskFailed, WorkerNotFound
from gpuq.task import State, TaskSpec

# TaskSpec options producers do not set: the rq bridge asks for its tasks' ends this way
BRIDGE_ONLY = {"report_end"}


def public(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls, callable) if not name.startswith("_")}


def test_the_async_client_has_the_sync_clients_surface() -> None:
    assert public(Queue) == public(AsyncQueue)
    assert public(Task) == public(AsyncTask)


@pytest.mark.parametrize("cls", [Queue, AsyncQueue])
def test_enqueue_spells_out_taskspecs_options(cls: type) -> None:
    given = inspect.signature(cls.enqueue).parameters
    spec = inspect.signature(TaskSpec.build).parameters
    options = {n: p for n, p in given.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    wanted = {n for n, p in spec.items() if p.kind is inspect.Parameter.KEYWORD_ONLY} - BRIDGE_ONLY
    assert set(options) == wanted | {"check_fit"}
    for name in wanted:
        assert given[name].default == spec[name].default, name
    assert options["check_fit"].default is False
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in given.values())


@pytest.mark.parametrize("method", ["cancel", "requeue"])
@pytest.mark.parametrize("cls", [Queue, AsyncQueue, Task, AsyncTask])
def test_cancel_and_requeue_return_a_state(cls: type, method: str) -> None:
    if hasattr(cls, method):
        assert get_type_hints(getattr(cls, method))["return"] is State


@pytest.fixture
def queue() -> Queue:
    return Queue(fakeredis.FakeRedis(decode_responses=True), Config(pool="api"))


def test_cancel_and_requeue_give_states(queue: Queue) -> None:
    task = queue.enqueue("h", {"a": 1}, model="m", vram_gb=1, priority="online")
    assert queue.record(task.id).priority.label == "P0"
    assert task.cancel() is State.QUEUED
    assert queue.requeue(task.id) is State.QUEUED
    with pytest.raises(NotRequeueable):
        queue.requeue(task.id)


def test_an_operators_requeue_reason_is_bounded_and_checked(queue: Queue) -> None:
    """Regression: Queue.requeue stored its reason as given (5 MiB in the task's error field,
    where a failure's error is one line of at most 2000 characters), and a reason of None
    raised redis-py's TypeError from deep inside the call."""
    task = queue.enqueue("h", model="m", vram_gb=1)
    task.cancel()
    assert queue.requeue(task.id, "line one\nline two " + "x" * (5 << 20)) is State.QUEUED
    error = task.record().error
    assert error is not None and error.startswith("line one line two x") and len(error) == 2000
    task.cancel()
    with pytest.raises(InvalidTask, match="requeue reason must be a string, got None"):
        queue.requeue(task.id, None)  # type: ignore[arg-type]
    assert task.status() is State.CANCELED


@pytest.mark.parametrize("value", ["no", "yes", 2, None])
def test_check_fit_must_be_a_bool(queue: Queue, value: object) -> None:
    """Regression: check_fit="no" read as true (a fit check asked for), and None as false,
    where every other yes/no option of enqueue is refused unless a bool."""
    with pytest.raises(InvalidTask, match="check_fit must be True or False"):
        queue.enqueue("h", model="m", vram_gb=1, check_fit=value)  # type: ignore[arg-type]
    with pytest.raises(InvalidTask, match="check_fit must be True or False"):
        queue.enqueue_many([{"handler": "h", "model": "m", "vram_gb": 1}],
                           check_fit=value)  # type: ignore[arg-type]
    assert queue.redis.dbsize() == 0


def test_enqueue_validates_before_sending(queue: Queue) -> None:
    with pytest.raises(InvalidTask):
        queue.enqueue("h", model="m", vram_gb=1, max_attempts=0)
    with pytest.raises(TypeError):
        queue.enqueue("h", model="m", vram_gb=1, colour="red")  # type: ignore[call-arg]
    assert queue.redis.dbsize() == 0


def test_drain_worker(queue: Queue) -> None:
    with pytest.raises(WorkerNotFound):
        queue.drain_worker("w1")
    seconds, _ = queue.redis.time()
    queue.redis.zadd(queue.keys.workers, {"w1": (seconds + 30) * 1000, "gone": (seconds - 30) * 1000})
    queue.drain_worker("w1")
    assert queue.redis.lrange(queue.keys.control("w1"), 0, -1) == ["drain"]
    with pytest.raises(WorkerNotFound):
        queue.drain_worker("gone")  # listed, past its liveness


class Closing:
    """Stands for a client: counts the closes."""

    def __init__(self) -> None:
        self.closed = 0

    def register_script(self, script: Any) -> Any:
        return script

    def close(self) -> None:
        self.closed += 1

    async def aclose(self) -> None:
        self.closed += 1


def test_a_queue_closes_the_client_it_made(monkeypatch: pytest.MonkeyPatch) -> None:
    given = Closing()
    with Queue(given) as queue:  # type: ignore[arg-type]
        assert queue.redis is given
    assert given.closed == 0  # the caller's client stays open
    made = Closing()
    monkeypatch.setattr("gpuq.client.connect", lambda *a, **k: made)
    with Queue.from_url("redis://h:1/0"):
        pass
    assert made.closed == 1


def test_an_async_queue_closes_the_client_it_made(monkeypatch: pytest.MonkeyPatch) -> None:
    given, made = Closing(), Closing()
    monkeypatch.setattr("gpuq.aio.connect_async", lambda *a, **k: made)

    async def scenario() -> None:
        async with AsyncQueue(given):  # type: ignore[arg-type]
            pass
        async with AsyncQueue.from_url("redis://h:1/0") as queue:
            assert queue.redis is made

    asyncio.run(scenario())
    assert (given.closed, made.closed) == (0, 1)


def test_cli_enqueue_defaults_are_taskspecs() -> None:
    options = {p.name: p for p in cli.commands["enqueue"].params}
    spec = inspect.signature(TaskSpec.build).parameters
    for name in ("est_s", "tenant", "max_attempts"):
        assert options[name].default == spec[name].default, name
    assert spec["deadline_s"].default is None and not options["deadline_s"].required
    assert options["priority"].default == spec["priority"].default.label
    assert options["model"].required and options["vram_gb"].required
    assert spec["preemptible"].default is True  # what --no-preempt turns off


def test_a_missing_estimate_is_sent_empty_for_the_pool_to_fill_in() -> None:
    """est_s None (the API's and the CLI's default) goes on the wire as "": enqueue.lua then
    uses the mean learned for the task's handler and model, else 1 s."""
    calls = Queue(fakeredis.FakeRedis(decode_responses=True)).calls
    at = 3 + 6  # the call's head (now, check_fit, the SLAs' text), then est_s, the 7th task field
    sent = calls.enqueue([TaskSpec.build("h", model="m", vram_gb=1),
                          TaskSpec.build("h", model="m", vram_gb=1, est_s=2.5),
                          TaskSpec.build("h", model="m", vram_gb=1, est_s=0)]).args
    assert [sent[at + 16 * i] for i in range(3)] == ["", "2.5", "0"]
    assert TaskSpec.build("h", model="m", vram_gb=1).est_s is None
    options = {p.name: p for p in cli.commands["enqueue"].params}
    assert options["est_s"].default is None and not options["est_s"].required


def test_a_task_enqueued_without_an_estimate_gets_the_learned_mean() -> None:
    q = Queue(fakeredis.FakeRedis(decode_responses=True))
    q.redis.hset(q.keys.runtimes, "h m", "2.5 4 12")
    learned = q.record(q.enqueue("h", model="m", vram_gb=1).id)
    assert (learned.est_s, learned.est_from) == (2.5, "history")
    given = q.record(q.enqueue("h", model="m", vram_gb=1, est_s=0.5).id)
    assert (given.est_s, given.est_from) == (0.5, None)
    assert asyncio.run(_async_learned()) == (2.5, "history")


async def _async_learned() -> tuple[float, str | None]:
    r = fakeredis.FakeAsyncRedis(decode_responses=True)
    q = AsyncQueue(r)
    await r.hset(q.keys.runtimes, "h m", "2.5 4 12")
    task = await q.enqueue("h", model="m", vram_gb=1)
    record = await task.record()
    await q.close()
    return record.est_s, record.est_from


def test_a_client_that_returns_bytes_is_refused_at_once() -> None:
    """Regression: a Queue on a client without decode_responses stored tasks, then called
    them corrupt (result) or raised a bare ValueError (cancel, requeue)."""
    from gpuq.errors import ConfigError

    for make in (lambda: Queue(fakeredis.FakeRedis()), lambda: AsyncQueue(fakeredis.FakeAsyncRedis())):
        with pytest.raises(ConfigError, match="decode_responses=True") as err:
            make()
        # the function it names exists (it once named a gpuq.connect that did not)
        import gpuq.connection
        assert "gpuq.connection.connect(url)" in str(err.value) and gpuq.connection.connect


def test_after_any_outcome_without_parents_is_refused_as_the_cli_refuses_it() -> None:
    with pytest.raises(InvalidTask, match="after_any_outcome needs after"):
        TaskSpec.build("h", None, model="m", vram_gb=1, after_any_outcome=True)
    spec = TaskSpec.build("h", None, model="m", vram_gb=1, after=["p"], after_any_outcome=True)
    assert spec.after == ("p",)


@pytest.mark.parametrize("pool, config, wanted", [
    (None, Config(pool="llm"), "llm"),  # the config's pool: it was replaced by "default"
    ("x", Config(pool="llm"), "x"),  # a pool named outright wins
    (None, None, "default"),
])
def test_from_url_keeps_the_configs_pool_unless_told(monkeypatch: pytest.MonkeyPatch, pool: str | None,
                                                     config: Config | None, wanted: str) -> None:
    """Regression: Queue.from_url(url, config=Config(pool="llm")) enqueued into pool
    "default" (its ``pool`` argument's default overrode the config's), where no worker of
    the pool ever saw the tasks."""
    import gpuq.aio
    import gpuq.client

    pools: list[str] = []

    def connect(url: str, *, tls: Any = None, pool: str = "?", **options: Any) -> Any:
        pools.append(pool)
        return Closing()

    monkeypatch.setattr(gpuq.client, "connect", connect)
    monkeypatch.setattr(gpuq.aio, "connect_async", lambda url, tls=None, **options: Closing())
    assert Queue.from_url("redis://h/0", pool, config).config.pool == wanted
    assert pools == [wanted]  # a Cluster client finds the master of that pool's slot
    assert AsyncQueue.from_url("redis://h/0", pool, config).config.pool == wanted


def test_a_canceled_task_s_result_says_canceled_once() -> None:
    """Found by a QA pass: result() of a canceled task raised "task T canceled: canceled"."""
    assert str(TaskFailed("t", "canceled", "canceled")) == "task t canceled"
    assert str(TaskFailed("t", "failed", "boom")) == "task t failed: boom"
    assert str(TaskFailed("t", "canceled", "its parent p failed")) == "task t canceled: its parent p failed"
