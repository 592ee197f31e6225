"""A warm hand-over's taking up (gpuq.worker.takeup): its handler starts without waiting for
began, whose reply decides the SLA, or makes the run a lost one when the hand-over was taken
back. A worker built in-process, not started: the test plays its runner."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from helpers import reap

from gpuq import Config, Queue, worker_record
from gpuq.app import App, Context
from gpuq.connection import connect
from gpuq.embedded import EmbeddedServer
from gpuq.task import State
from gpuq.worker import batch
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.loop import Worker
from gpuq.worker.takeup import TakeUp

WAIT_S = 10  # a bound for what happens at once, never reached when it works
# the paused test's: under the clients' socket timeout (5 s), past which a call waiting for
# began gives up and runs the handler all the same
PAUSED_S = 2


class Held:
    """The test's handler: says it started, then waits to be let go."""

    def __init__(self) -> None:
        self.started, self.go = threading.Event(), threading.Event()
        self.ctx: Context | None = None


@contextmanager
def warm(queue: Queue, batched: bool = False, wait_ms: int = 0) -> Iterator[tuple[Worker, Held]]:
    """Worker w1, idle in the pool (so enqueue hands it tasks), holding model m; ``batched``:
    its handler a batch handler that waits ``wait_ms`` for a batch."""
    app, held = App("takeup-test"), Held()
    app.any_model()(lambda name: name)

    def handler(model: Any, payload: Any, ctx: Any) -> Any:
        held.ctx = ctx.contexts[0] if batched else ctx
        held.started.set()
        assert held.go.wait(WAIT_S)
        return ["done"] if batched else "done"

    app.handler("held", **({"batch": 4, "batch_wait_ms": wait_ms} if batched else {}))(handler)

    config = Config(pool=queue.config.pool, prefix=queue.config.prefix)
    worker = Worker(queue.redis, config, app, GpuInfo("L4", "u1", 24, None, "declared"), worker_id="w1")
    identity = worker_record.identity("w1", worker.gpu, 5.0, 1, "0123", "h", 1, (2000, 5, 30_000))
    worker.presence.register(identity, 30_000)
    with worker.cache.lock:
        res = worker.cache.reserve("m", 4)
    assert res is not None and res.cold
    worker.executor.loading.prepare(res)  # loaded: what it hands over next starts warm
    worker.cache.release(res)
    assert worker.claim() == 0.0  # found nothing: idle
    try:
        yield worker, held
    finally:
        held.go.set()
        worker.executor.takeups.close()


def hand_over(queue: Queue, worker: Worker) -> tuple[str, dict[str, str]]:
    task = queue.enqueue("held", model="m", vram_gb=4, priority="P0")
    message = queue.redis.rpop(queue.keys.wake(worker.id))  # the runner's BLPOP
    assert message is not None
    return task.id, dict(json.loads(message))


def in_time() -> float:
    """A start_by for a hand-over popped by hand: its worker is in time (takeup.start_by)."""
    return time.monotonic() + WAIT_S


def run(worker: Worker, fields: dict[str, str]) -> tuple[threading.Thread, list[Any]]:
    """The runner: take the hand-over up and run it in a thread; the settle calls go out."""
    claimed = worker.handed(fields, in_time())
    assert claimed is not None
    pending: list[Any] = []

    def runner() -> None:
        pending.extend(batch.execute(worker.executor, claimed, handed=True))
        worker.settle(pending)

    thread = threading.Thread(target=runner, daemon=True)
    thread.start()
    return thread, pending


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch-no-wait"])
def test_a_warm_hand_over_starts_its_handler_before_began_is_answered(real_queue: Queue,
                                                                     batched: bool) -> None:
    """The server holds every write (CLIENT PAUSE WRITE), began's too: the handler starts
    all the same, a batch handler's that waits for no batch too; once let go, began runs
    before the ack, so the SLA is decided."""
    with warm(real_queue, batched) as (worker, held):
        paused(real_queue, worker, held)


def paused(queue: Queue, worker: Worker, held: Held) -> None:
    tid, fields = hand_over(queue, worker)
    queue.redis.execute_command("CLIENT", "PAUSE", str(WAIT_S * 2000), "WRITE")
    try:
        thread, _ = run(worker, fields)
        assert held.started.wait(PAUSED_S), "the handler waited for began"
    finally:
        queue.redis.execute_command("CLIENT", "UNPAUSE")
    held.go.set()
    thread.join(WAIT_S)
    r = queue.record(tid)
    assert (r.state, r.result) == (State.SUCCEEDED, "done")
    assert queue.redis.hget(queue.keys.task(tid), "began_at")
    assert queue.redis.hget(queue.keys.stats, "sla_met:P0") == "1"
    assert queue.redis.zscore(queue.keys.handed, tid) is None


def test_a_warm_hand_over_taken_back_before_began_runs_as_a_lost_run(queue: Queue) -> None:
    """Taken back at its pickup deadline before its worker's began arrived (the worker
    stalled after popping it): began's reply tells the worker's control the run is lost
    (should_stop, stopped past the grace), and its ack is fenced off."""
    with warm(queue) as (worker, held):
        taken_back(queue, worker, held)


def taken_back(queue: Queue, worker: Worker, held: Held) -> None:
    tid, fields = hand_over(queue, worker)
    secs, micros = queue.redis.time()
    # past the P0 pickup deadline (100 ms); the whole second alone was not, from x.9 s on
    now_ms = int(secs) * 1000 + int(micros) // 1000 + 1000
    reap(queue, now_ms=now_ms)
    assert queue.record(tid).state is State.QUEUED
    thread, pending = run(worker, fields)
    assert held.started.wait(WAIT_S)
    control = worker.heartbeat().control
    told = queue.redis.blpop([control.key], timeout=WAIT_S)
    assert told is not None and told[1] == f"lost {tid} {fields['token']}"
    control.handle(told[1])
    assert held.ctx is not None and held.ctx.should_stop()
    held.go.set()
    thread.join(WAIT_S)
    assert [c.script for c in pending] == ["ack"]  # sent, and refused: another run owns it
    r = queue.record(tid)
    assert (r.state, r.result, r.attempt) == (State.QUEUED, None, 0)
    assert "sla_met:P0" not in queue.redis.hgetall(queue.keys.stats)


def test_a_warm_hand_over_popped_late_and_taken_back_never_starts_its_handler(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker pops the hand-over in time, then stalls (a loaded host) past half its
    pickup window, and meanwhile the reaper takes it back: its began is waited for, finds
    it taken back, and the handler never starts here (another worker runs it)."""
    with warm(queue) as (worker, held):
        task = queue.enqueue("held", model="m", vram_gb=4, priority="P0")  # P0: 100 ms window
        handed = worker.handed

        def stalled(fields: dict[str, str], *args: Any) -> Any:
            time.sleep(0.3)  # the pop's reply read late: more than the window has passed
            reap(queue, now_ms=server_ms(queue) + 1000)  # past its pickup deadline
            return handed(fields, *args)

        monkeypatch.setattr(worker, "handed", stalled)
        claimed = worker.wait_for_work(0.0)
        assert isinstance(claimed, tuple)
        held.go.set()
        pending = batch.execute(worker.executor, claimed, handed=True)
        assert not held.started.is_set(), "the handler ran, and will run again elsewhere"
        assert pending == []
        r = queue.record(task.id)
        assert (r.state, r.attempt) == (State.QUEUED, 0)
        assert not worker.running.snapshot()


def test_a_warm_hand_over_to_a_batch_that_waits_is_taken_up_before_the_wait(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a QA pass: a P3 task handed to a batch handler with batch_wait_ms 3 s (past
    its 2 s pickup deadline) was taken back during the wait, claimed again and waited
    again: its handler started after 6 s, not 3. Now the hand-over is taken up (its lease
    renewed) before the wait, as a cold one is before its load."""
    with warm(queue, batched=True, wait_ms=3000) as (worker, held):
        task = queue.enqueue("held", model="m", vram_gb=4, priority="P2")  # pickup within 2 s
        claimed = worker.wait_for_work(0.0)
        assert isinstance(claimed, tuple)

        def waited(*args: Any) -> bool:  # the wait, its pickup deadline passing meanwhile
            reap(queue, now_ms=server_ms(queue) + 2_500)
            return False

        monkeypatch.setattr(batch, "wait_for_more", waited)
        held.go.set()
        worker.settle(batch.execute(worker.executor, claimed, threading.Event(), handed=True))
        assert held.started.is_set()
        r = queue.record(task.id)
        assert (r.state, r.result, r.attempt) == (State.SUCCEEDED, "done", 1)


def server_ms(queue: Queue) -> int:
    secs, micros = queue.redis.time()
    return int(secs) * 1000 + int(micros) // 1000


def test_a_warm_hand_over_still_runs_when_began_cannot_be_sent(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """The take-up's connection fails: began goes the waiting way, and the task runs."""
    with warm(queue) as (worker, held):
        unsent(queue, worker, held, monkeypatch)


def unsent(queue: Queue, worker: Worker, held: Held, monkeypatch: pytest.MonkeyPatch) -> None:
    tid, fields = hand_over(queue, worker)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise redis.ConnectionError("refused")

    pool = queue.redis.connection_pool
    conn = pool.get_connection()
    monkeypatch.setattr(conn, "send_packed_command", refuse)
    worker.executor.takeups._idle.append(conn)
    held.go.set()
    thread, _ = run(worker, fields)
    thread.join(WAIT_S)
    monkeypatch.undo()
    pool.release(conn)
    assert queue.record(tid).state is State.SUCCEEDED
    assert queue.redis.hget(queue.keys.stats, "sla_met:P0") == "1"


def began_at(queue: Queue, tid: str) -> str | None:
    """The task's began_at once set, waited for up to WAIT_S (None: began never ran)."""
    for _ in range(WAIT_S * 20):
        if at := queue.redis.hget(queue.keys.task(tid), "began_at"):
            return str(at)
        threading.Event().wait(0.05)
    return None


def test_a_warm_hand_over_after_its_kept_connection_was_closed_is_taken_up(real_queue: Queue) -> None:
    """The take-up's idle connection was closed by the server (a restart, a failover's
    CLIENT KILL) since its last hand-over: the next one's began still runs, so its SLA is
    counted and it is not taken back (run twice) at its pickup deadline."""
    with warm(real_queue) as (worker, held):
        tid, fields = hand_over(real_queue, worker)
        held.go.set()
        run(worker, fields)[0].join(WAIT_S)
        assert real_queue.record(tid).state is State.SUCCEEDED
        assert worker.executor.takeups._idle, "the take-up kept its connection"
        assert worker.claim() == 0.0  # idle again
        real_queue.redis.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        held.go.clear()
        tid, fields = hand_over(real_queue, worker)
        thread, _ = run(worker, fields)
        assert held.started.wait(WAIT_S)
        assert began_at(real_queue, tid), "began was lost"
        assert real_queue.redis.zscore(real_queue.keys.handed, tid) is None
        held.go.set()
        thread.join(WAIT_S)
    assert real_queue.redis.hget(real_queue.keys.stats, "sla_met:P0") == "2"


def test_a_warm_hand_over_whose_began_was_cut_off_unanswered_is_taken_up(real_queue: Queue) -> None:
    """The take-up's connection is killed with began written and unanswered (held by the
    server's paused writes, so it never ran): began goes again, on a connection of the
    client's, so the hand-over is taken up and its SLA counted."""
    with warm(real_queue) as (worker, held):
        tid, fields = hand_over(real_queue, worker)
        real_queue.redis.execute_command("CLIENT", "PAUSE", str(WAIT_S * 2000), "WRITE")
        try:
            thread, _ = run(worker, fields)
            assert held.started.wait(WAIT_S)
            real_queue.redis.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        finally:
            real_queue.redis.execute_command("CLIENT", "UNPAUSE")
        assert began_at(real_queue, tid), "began was lost"
        assert real_queue.redis.zscore(real_queue.keys.handed, tid) is None
        held.go.set()
        thread.join(WAIT_S)
    assert real_queue.redis.hget(real_queue.keys.stats, "sla_met:P0") == "1"


def test_a_warm_hand_over_cut_off_before_its_ack_is_read_is_taken_up(real_queue: Queue) -> None:
    """The runner reads began's reply with its ack (the take-up thread busy elsewhere) and
    the connection is killed first, began unrun (the server's writes paused): began goes
    again ahead of the ack's retry, so the SLA is counted."""
    with warm(real_queue) as (worker, held):
        takeups = worker.executor.takeups
        busy = TakeUp(None, worker.calls.began("x", 1), {}, None)  # type: ignore[arg-type]
        busy.lock.acquire()  # the take-up thread waits on it: the runner reads began's reply
        takeups._queue.put(busy)
        tid, fields = hand_over(real_queue, worker)
        claimed = worker.handed(fields, in_time())
        assert claimed is not None
        real_queue.redis.execute_command("CLIENT", "PAUSE", str(WAIT_S * 2000), "WRITE")
        try:
            held.go.set()
            pending = batch.execute(worker.executor, claimed, handed=True)
            real_queue.redis.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        finally:
            real_queue.redis.execute_command("CLIENT", "UNPAUSE")
        with pytest.raises(redis.ConnectionError):
            worker.settle(pending)
        assert real_queue.redis.hget(real_queue.keys.stats, "sla_met:P0") == "1"
        worker.settle(pending)  # the runner's retry
        busy.answered = True
        busy.lock.release()
    assert real_queue.record(tid).state is State.SUCCEEDED


def test_began_sent_again_after_its_runs_ack_ran_reads_as_no_lost_lease(
        real_queue: Queue, caplog: pytest.LogCaptureFixture) -> None:
    """The connection is cut after began and the ack both ran, their replies unread: began
    goes again and finds the task ended. That is no lost lease (the ack's retry tells how
    the run ended): said as such, not as a hand-over taken back."""
    with warm(real_queue) as (worker, held):
        held.go.set()
        tid, fields = hand_over(real_queue, worker)
        claimed = worker.handed(fields, in_time())
        assert claimed is not None
        worker.settle(batch.execute(worker.executor, claimed, handed=True))
        assert real_queue.record(tid).state is State.SUCCEEDED
        call = worker.calls.began(tid, claimed[2].token, warm=True)
        with caplog.at_level("INFO", logger="gpuq.worker.takeup"):
            worker.executor.takeups.answer(TakeUp(None, call, fields, claimed[2]),
                                           redis.ConnectionError("cut"), ended=True)
        said = [r.getMessage() for r in caplog.records]
        assert not any("lease.lost" in m for m in said), said
        assert any(m.startswith(f"task.take_up_after_end task={tid}") for m in said), said


def test_a_take_up_connection_silenced_by_a_stopped_server_is_given_up_in_bounded_time() -> None:
    """The server stops answering (SIGSTOP: the connection stays open, silent, as in a
    partition) with began written: the take-up's read gives up at the pool's connect
    timeout and drops the connection, rather than hold the take-up thread for good; began
    goes again and, the server back, the hand-over is taken up and its SLA counted once."""
    with EmbeddedServer() as server:
        client = connect(server.url, socket_connect_timeout=0.5)
        queue = Queue(client, Config(pool="silenced"))
        try:
            with warm(queue) as (worker, held):
                tid, fields = hand_over(queue, worker)
                assert server.proc is not None
                server.proc.send_signal(signal.SIGSTOP)
                try:
                    thread, _ = run(worker, fields)
                    assert held.started.wait(WAIT_S)
                    up = worker.executor.takeups._sent[(tid, fields["token"])]
                    assert wait_until(lambda: up.conn._sock is None), "still blocked on its read"
                finally:
                    server.proc.send_signal(signal.SIGCONT)
                assert began_at(queue, tid), "began was lost"
                held.go.set()
                thread.join(WAIT_S)
            assert queue.record(tid).state is State.SUCCEEDED
            stats = queue.redis.hgetall(queue.keys.stats)  # decided once: late, by the stop
            assert int(stats.get("sla_met:P0", 0)) + int(stats.get("sla_missed:P0", 0)) == 1
        finally:
            client.close()


def wait_until(check: Any) -> bool:
    """check() once true, polled for up to WAIT_S."""
    for _ in range(WAIT_S * 20):
        if check():
            return True
        threading.Event().wait(0.05)
    return False
