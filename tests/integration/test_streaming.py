"""Streamed results and progress against the real server: worker processes running
``sim.stream`` (tests/procs.py), producers reading chunks as they come, sync, async and CLI."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
from typing import Any

import pytest
from helpers import claim, enqueue
from procs import Procs, est, wait_for

from gpuq import Config, Queue, State
from gpuq.aio import AsyncQueue
from gpuq.embedded import EmbeddedServer
from gpuq.errors import EmitError, ResultTimeout, StaleLease
from gpuq.stream import Chunk, Emitter, emit_call

pytestmark = pytest.mark.slow



def seen(chunks: list[Chunk]) -> list[tuple[Any, ...]]:
    return [(c.data["i"], c.attempt, c.seq, c.restart) for c in chunks]


def running_task(q: Queue) -> tuple[str, int]:
    """A task enqueued and claimed as worker w1 would: its id and fencing token."""
    tid = enqueue(q)
    fields = claim(q, "w1", 80)
    assert fields is not None
    return tid, int(fields["token"])


def test_chunks_arrive_while_the_task_runs(procs: Procs, real_queue: Queue) -> None:
    procs.worker("w1")
    task = real_queue.enqueue("sim.stream", {"chunks": 5}, model="m-s", vram_gb=4,
                              est_s=est(1.5))
    got, state_at_first = [], None
    for chunk in task.stream(timeout=20):
        if not got:
            state_at_first = real_queue.record(task.id).state
        got.append(chunk)
    assert state_at_first is State.RUNNING  # the first chunk came long before the end
    assert seen(got) == [(i, 1, i, False) for i in range(5)]
    assert task.result(timeout=5) == 5
    entries = real_queue.redis.xrange(real_queue.keys.stream(task.id))
    assert entries[-1][1] == {"end": "succeeded"}
    assert 0 < real_queue.redis.pttl(real_queue.keys.stream(task.id))


def test_any_number_of_readers_and_late_ones_get_everything(procs: Procs,
                                                            real_queue: Queue) -> None:
    procs.worker("w1")
    task = real_queue.enqueue("sim.stream", {"chunks": 4}, model="m-s", vram_gb=4,
                              est_s=est(1.0))
    early: list[list[Chunk]] = [[], []]
    readers = [threading.Thread(target=lambda out=out: out.extend(task.stream(timeout=20)))
               for out in early]
    for r in readers:
        r.start()
    for r in readers:
        r.join(25)
    procs.wait_state(task.id, State.SUCCEEDED)
    late = list(real_queue.task(task.id).stream(timeout=0))  # ended: read to the end at once
    assert seen(early[0]) == seen(early[1]) == seen(late) == [(i, 1, i, False) for i in range(4)]


def test_a_retried_task_shows_the_reader_a_restart(procs: Procs, real_queue: Queue) -> None:
    procs.worker("w1")
    task = real_queue.enqueue("sim.stream", {"chunks": 4, "fail_first": 2}, model="m-s",
                              vram_gb=4, est_s=est(0.4), max_attempts=2)
    got = list(task.stream(timeout=20))
    assert seen(got) == [(0, 1, 0, False), (1, 1, 1, False),
                         (0, 2, 0, True), (1, 2, 1, False), (2, 2, 2, False), (3, 2, 3, False)]
    assert task.result(timeout=5) == 4


def test_a_worker_that_lost_its_lease_cannot_append(procs: Procs, real_queue: Queue) -> None:
    """A worker frozen mid-stream loses its lease; the task runs again elsewhere. Thawed, the
    first worker appends nothing more: every entry of its run precedes the new run's."""
    w1 = procs.worker("w1")
    procs.reaper()
    task = real_queue.enqueue("sim.stream", {"chunks": 8}, model="m-s", vram_gb=4,
                              est_s=est(2.0), max_attempts=3)
    key = real_queue.keys.stream(task.id)
    wait_for(lambda: real_queue.redis.xlen(key) >= 2, message="two chunks")
    w1.signal(signal.SIGSTOP)
    try:
        procs.worker("w2")
        procs.wait_running_on(task.id, "w2")
        frozen = real_queue.redis.xlen(key)
    finally:
        w1.signal(signal.SIGCONT)
    got = list(task.stream(timeout=30))
    assert task.result(timeout=10) == 8
    tokens = [fields["token"] for _, fields in real_queue.redis.xrange(key) if "token" in fields]
    first, last = tokens[0], tokens[-1]
    old = tokens.count(first)
    assert first != last and tokens == [first] * old + [last] * 8  # runs never interleave
    assert 2 <= old <= frozen < 8  # the thawed worker appended nothing more
    restarts = [c for c in got if c.restart]
    assert len(restarts) == 1 and [c.seq for c in got[got.index(restarts[0]):]] == list(range(8))


def test_progress_is_visible_through_the_api_and_the_cli(procs: Procs, real_queue: Queue) -> None:
    procs.worker("w1")
    task = real_queue.enqueue("sim.stream", {"chunks": 3, "progress": True}, model="m-s",
                              vram_gb=4, est_s=est(6.0))
    assert task.progress() is None
    assert wait_for(task.progress, message="a progress report") == (1 / 3, "chunk 1 of 3")
    shown = json.loads(procs.run_cli("task", task.id, "--json"))
    assert shown["progress"] == pytest.approx(1 / 3) and shown["progress_msg"] == "chunk 1 of 3"
    assert f"progress: {task.id[-8:]} 33% chunk 1 of 3" in procs.run_cli("top", "--once")
    assert f"progress {1 / 3!r}" in " ".join(procs.run_cli("task", task.id).split())
    assert task.result(timeout=20) == 3
    assert task.progress() == (1.0, "chunk 3 of 3")


def test_cli_enqueue_stream_prints_chunks_as_they_come(procs: Procs) -> None:
    procs.worker("w1")
    args = [*procs.base_args(), "enqueue", "sim.stream", "--payload", '{"chunks": 3}', "--model",
            "m-s", "--vram-gb", "4", "--est-s", str(est(1.5)), "--stream", "--timeout", "20"]
    proc = subprocess.Popen(args, env=procs.environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert proc.poll() is None  # printed while the task still runs
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    lines = [first, *(json.loads(line) for line in out.splitlines())]
    assert [c["i"] for c in lines[:3]] == [0, 1, 2] and lines[3] == 3
    assert proc.returncode == 0, err
    timed_out = procs.cli("enqueue", "sim.stream", "--model", "m-none", "--vram-gb", "500",
                          "--stream", "--timeout", "0.3")
    assert timed_out.returncode == 4  # timed out: the task stands
    assert "did not finish within 0.3 s" in timed_out.stderr


def test_bad_chunks_and_stale_tokens_on_the_real_server(make_real_queue: Any) -> None:
    q: Queue = make_real_queue(stream_chunk_max_bytes=16)
    tid, token = running_task(q)
    e = Emitter(q.scripts, q.config, tid, token)
    for bad in (object(), "x" * 20):
        with pytest.raises(EmitError):
            e.emit(bad)
    with pytest.raises(EmitError, match="not valid JSON"):
        q.scripts.run(emit_call(tid, token, 0, "nan", q.config))
    with pytest.raises(EmitError):
        e.progress(1.5, "")
    assert not q.redis.exists(q.keys.stream(tid))
    e.emit("ok")
    q.requeue(tid)  # the lease is gone
    with pytest.raises(StaleLease):
        e.emit("late")
    assert q.redis.xlen(q.keys.stream(tid)) == 1
    with pytest.raises(ResultTimeout):
        list(q.task(tid).stream(timeout=0.2))  # queued: no end yet


def test_the_async_reader(redis_server: EmbeddedServer, pool: str, prefix: str,
                          make_real_queue: Any) -> None:
    sync_q: Queue = make_real_queue()
    tid, token = running_task(sync_q)

    def worker() -> None:
        e = Emitter(sync_q.scripts, sync_q.config, tid, token)
        for i in range(3):
            time.sleep(0.05)
            e.emit({"i": i})
        e.progress(1, "done")
        sync_q.scripts.run(sync_q.calls.ack(tid, token, '"fin"'))

    async def scenario() -> None:
        q = AsyncQueue.from_url(redis_server.url, pool=pool, config=Config(prefix=prefix))
        try:
            task = q.task(tid)
            thread = threading.Thread(target=worker)
            thread.start()
            got = [c async for c in task.stream(timeout=10)]
            thread.join()
            assert [c.data for c in got] == [{"i": 0}, {"i": 1}, {"i": 2}]
            assert await task.result(timeout=1) == "fin"
            assert await task.progress() == (1.0, "done")
            queued = await q.enqueue("h", model="m", vram_gb=1)
            with pytest.raises(ResultTimeout):
                [c async for c in queued.stream(timeout=0.2)]
        finally:
            await q.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("side", ["sync", "asyncio"])
def test_a_reader_reads_on_from_its_last_chunk_after_the_server_dropped_it(
        redis_server: EmbeddedServer, pool: str, prefix: str, make_real_queue: Any, side: str) -> None:
    """Regression: a reader blocked on XREAD raised ConnectionFailed when the server closed
    its connection (a restart, CLIENT KILL) mid-stream; it reads again from its last chunk,
    as a result wait rides the outage out."""
    sync_q: Queue = make_real_queue()
    admin = sync_q.redis
    tid, token = running_task(sync_q)

    def worker() -> None:
        e = Emitter(sync_q.scripts, sync_q.config, tid, token)
        for i in range(4):
            time.sleep(0.2)
            if i == 2:  # the reader blocks in XREAD for the third chunk
                admin.client_kill_filter(_type="normal", skipme=True)
            e.emit({"i": i})
        sync_q.scripts.run(sync_q.calls.ack(tid, token, '"fin"'))

    thread = threading.Thread(target=worker)
    if side == "sync":
        reader = Queue.from_url(redis_server.url, pool, Config(prefix=prefix))
        thread.start()
        got = [c.data for c in reader.task(tid).stream(timeout=10)]
        reader.close()
    else:
        async def read() -> list[Any]:
            async with AsyncQueue.from_url(redis_server.url, pool=pool, config=Config(prefix=prefix)) as q:
                thread.start()
                return [c.data async for c in q.task(tid).stream(timeout=10)]

        got = asyncio.run(read())
    thread.join()
    assert got == [{"i": i} for i in range(4)]
