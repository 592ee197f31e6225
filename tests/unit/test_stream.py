"""gpuq.stream on fakeredis: emit and progress fenced by the lease, the end marker, the
reader's attempt rule, and bad input."""

from __future__ import annotations

import json
import math
import threading
import time
from typing import Any

import fakeredis
import pytest
import redis
from helpers import T0, claim, enqueue

from gpuq import App, Config, Queue
from gpuq.app import Context
from gpuq.errors import EmitError, StaleLease, TaskNotFound
from gpuq.stream import (
    MAX_PROGRESS_MESSAGE,
    Chunk,
    Emitter,
    Follow,
    Memory,
    check_progress,
    emit_call,
    encode_chunk,
    entries_of,
    follow_call,
    parse_progress,
)
from gpuq.testing import drain, memory_queue
from gpuq.views.inspect import pool_view
from gpuq.views.top import render_top


@pytest.fixture
def q() -> Queue:
    return Queue(fakeredis.FakeRedis(decode_responses=True), Config(pool="s"))


def running(q: Queue) -> tuple[str, int]:
    """A task claimed like a worker: its id and token."""
    tid = enqueue(q)
    fields = claim(q, "w1", 80)
    assert fields is not None and fields["id"] == tid
    return tid, int(fields["token"])


def emitter(q: Queue, tid: str, token: int) -> Emitter:
    return Emitter(q.scripts, q.config, tid, token)


def entries(q: Queue, tid: str) -> list[dict[str, str]]:
    return [fields for _, fields in q.redis.xrange(q.keys.stream(tid))]


# -- bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize("value, why", [
    (object(), "not JSON-serializable"), (b"raw", "not bytes"), (math.nan, "not JSON"),
    ("x" * 100, "larger than the 64 allowed")])
def test_a_chunk_that_is_not_json_or_too_large_is_refused(value: Any, why: str) -> None:
    with pytest.raises(EmitError, match=why):
        encode_chunk(value, 64, "t-1")
    assert encode_chunk({"a": [1, "é"]}, 64) == '{"a":[1,"\\u00e9"]}'


@pytest.mark.parametrize("fraction, message", [
    (-0.1, ""), (1.01, ""), (math.nan, ""), (True, ""), ("0.5", ""), (None, ""),
    (0.5, None), (0.5, "x" * (MAX_PROGRESS_MESSAGE + 1))])
def test_bad_progress_is_refused(fraction: Any, message: Any) -> None:
    with pytest.raises(EmitError):
        check_progress(fraction, message)
    assert check_progress(1, "done") == (1.0, "done")


def test_a_context_off_a_worker_keeps_what_it_would_send() -> None:
    ctx = Context("t", 1, "w", "m", 1.0, 0.0)
    ctx.emit({"i": (1, 2)})
    ctx.emit("two")
    ctx.progress(0.25, "a quarter")
    assert isinstance(ctx.sink, Memory)
    assert ctx.sink.chunks == [{"i": [1, 2]}, "two"] and ctx.sink.last_progress == (0.25, "a quarter")
    with pytest.raises(EmitError):
        ctx.emit({1, 2})
    with pytest.raises(EmitError):
        ctx.progress(2)


def test_a_worker_s_sink_is_made_once_at_the_first_chunk_whatever_the_threads() -> None:
    """The worker gives a context how to make its Emitter (most runs emit nothing); two
    threads' first chunks must share one (its chunk numbering)."""
    made: list[Memory] = []

    def new_sink() -> Memory:
        time.sleep(0.01)  # both threads in here at once, were it not for the lock
        made.append(Memory())
        return made[-1]

    ctx = Context("t", 1, "w", "m", 1.0, 0.0)
    ctx.new_sink = new_sink
    threads = [threading.Thread(target=ctx.emit, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and sorted(made[0].chunks) == [0, 1, 2, 3]


# -- the worker side: fenced by the lease ----------------------------------------------

def test_emit_appends_entries_numbered_per_run(q: Queue) -> None:
    tid, token = running(q)
    e = emitter(q, tid, token)
    e.emit({"i": 0})
    e.emit("one")
    assert entries(q, tid) == [
        {"attempt": "1", "token": str(token), "seq": "0", "data": '{"i":0}'},
        {"attempt": "1", "token": str(token), "seq": "1", "data": '"one"'}]
    assert q.redis.hget(q.keys.task(tid), "streamed") == "1"
    assert q.redis.pttl(q.keys.stream(tid)) == -1  # no TTL while the task runs


@pytest.mark.parametrize("again, seqs", [(False, ["0", "1", "2", "3"]), (True, ["0", "1", "1", "2"])])
def test_a_chunk_after_one_whose_reply_was_lost_takes_the_next_number(
        q: Queue, again: bool, seqs: list[str]) -> None:
    """Regression: a chunk whose reply was lost kept its seq, so a different chunk emitted
    next (the handler caught the error and went on) went out under the same seq, and readers
    skipped it as a repeat. Sent again, the same chunk keeps its seq (a repeat to skip)."""
    tid, token = running(q)
    e = emitter(q, tid, token)
    run, calls = e.scripts.run, [0]

    def reply_lost(call: Any) -> Any:
        calls[0] += 1
        got = run(call)
        if calls[0] == 2:  # stored, then the connection drops before the reply
            raise redis.ConnectionError("Connection reset by peer")
        return got

    e.scripts.run = reply_lost  # type: ignore[method-assign]
    e.outage_s = 0  # the outage outlasts the emit's patience: the handler gets the error
    e.emit("A")
    with pytest.raises(redis.ConnectionError):
        e.emit("B")
    e.emit("B" if again else "C")
    e.emit("D")
    assert [x["seq"] for x in entries(q, tid)] == seqs


def test_an_emit_rides_out_a_short_outage(q: Queue) -> None:
    """Regression: a 3 s Redis restart while a handler streamed failed its task (the emit's
    ConnectionError reached the handler: an attempt spent, the task lost on its last). The
    send is tried again; a chunk stored before its reply was lost is a repeat readers skip."""
    tid, token = running(q)
    e = emitter(q, tid, token)
    run, calls = e.scripts.run, [0]

    def flaky(call: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            raise redis.ConnectionError("Error 111 connecting: Connection refused")
        got = run(call)
        if calls[0] == 3:  # stored, then the reply lost
            raise redis.ConnectionError("Connection reset by peer")
        return got

    e.scripts.run = flaky  # type: ignore[method-assign]
    e.emit("A")
    e.emit("B")  # refused, then stored with its reply lost, then stored again: no error
    e.emit("C")
    e.progress(0.5, "half")
    assert calls[0] == 6
    assert [(x["seq"], x["data"]) for x in entries(q, tid)] == [
        ("0", '"A"'), ("1", '"B"'), ("1", '"B"'), ("2", '"C"')]


def test_a_stale_token_or_an_ended_task_appends_nothing(q: Queue) -> None:
    tid, token = running(q)
    stale = emitter(q, tid, token + 1)
    with pytest.raises(StaleLease):
        stale.emit("late")
    with pytest.raises(StaleLease):
        stale.progress(0.5, "")
    q.requeue(tid)  # the lease is gone: the worker that held it may not write
    ctx = Context(tid, 1, "w1", "A", 1.0, 0.0)
    ctx.sink = emitter(q, tid, token)
    with pytest.raises(StaleLease):
        ctx.emit("late")
    assert ctx.lost and ctx.should_stop()
    assert not q.redis.exists(q.keys.stream(tid))
    assert q.redis.hget(q.keys.task(tid), "progress") is None
    with pytest.raises(TaskNotFound):
        emitter(q, "nosuch", 1).emit("x")


def test_the_server_checks_chunks_too(q: Queue) -> None:
    tid, token = running(q)
    with pytest.raises(EmitError, match="not valid JSON"):
        q.scripts.run(emit_call(tid, token, 0, "{nope", q.config))
    small = Config(pool="s", stream_chunk_max_bytes=4)
    with pytest.raises(EmitError, match="larger than 4 bytes"):
        q.scripts.run(emit_call(tid, token, 0, '"hello"', small))
    with pytest.raises(EmitError, match="seq must be"):
        q.scripts.run(emit_call(tid, token, -1, '"x"', q.config))
    assert not q.redis.exists(q.keys.stream(tid))


def test_the_stream_keeps_about_maxlen_entries(q: Queue) -> None:
    tid, token = running(q)
    e = Emitter(q.scripts, Config(pool="s", stream_maxlen=5), tid, token)
    for i in range(400):
        e.emit(i)
    assert 5 <= q.redis.xlen(q.keys.stream(tid)) < 400


def test_progress_is_stored_on_the_task(q: Queue) -> None:
    tid, token = running(q)
    assert q.task(tid).progress() is None
    emitter(q, tid, token).progress(0.4, "loading")
    assert q.task(tid).progress() == (0.4, "loading")
    record = q.record(tid)
    assert (record.progress, record.progress_msg) == (0.4, "loading")
    assert parse_progress(["running", "2", ""], tid) is None  # not a fraction
    with pytest.raises(TaskNotFound):
        q.task("nosuch").progress()


# -- the end marker --------------------------------------------------------------------

def test_ack_ends_a_streamed_task_with_a_marker_and_the_task_ttl(q: Queue) -> None:
    tid, token = running(q)
    emitter(q, tid, token).emit("hi")
    q.scripts.run(q.calls.ack(tid, token, "1"))
    assert entries(q, tid)[-1] == {"end": "succeeded"}
    ttl = q.redis.pttl(q.keys.stream(tid))
    assert abs(ttl - q.redis.pttl(q.keys.task(tid))) < 1000 and ttl > 0


def test_a_task_that_never_streamed_gets_no_stream(q: Queue) -> None:
    tid, token = running(q)
    q.scripts.run(q.calls.ack(tid, token, "1"))
    assert not q.redis.exists(q.keys.stream(tid))
    assert list(q.task(tid).stream(timeout=0)) == []  # ended: nothing to read, no block


def test_a_reader_following_a_silent_task_gets_the_end_of_any_ending(q: Queue) -> None:
    for end in ("cancel", "fail", "ack"):
        tid, token = running(q)
        assert q.scripts.run(follow_call(tid)) == "running"
        if end == "cancel":
            q.cancel(tid)
        elif end == "fail":
            q.scripts.run(q.calls.fail(tid, token, "boom", retry=False))
        else:
            q.scripts.run(q.calls.ack(tid, token, "1"))
        state = {"cancel": "canceled", "fail": "failed", "ack": "succeeded"}[end]
        assert entries(q, tid) == [{"end": state}]
    with pytest.raises(TaskNotFound):
        q.scripts.run(follow_call("nosuch"))


def test_an_operator_requeue_of_an_ended_task_starts_its_stream_afresh(q: Queue) -> None:
    tid, token = running(q)
    e = emitter(q, tid, token)
    e.emit("first life")
    e.progress(0.9, "")
    q.scripts.run(q.calls.fail(tid, token, "boom", retry=False))
    q.requeue(tid)
    assert not q.redis.exists(q.keys.stream(tid))
    assert q.task(tid).progress() is None
    assert q.redis.hget(q.keys.task(tid), "streamed") == ""


def test_a_retry_restarts_the_stream_for_a_reader(q: Queue) -> None:
    tid, token = running(q)
    emitter(q, tid, token).emit("a")
    emitter(q, tid, token).emit("b")  # a second Emitter of one run: seq 0 again, a repeat
    q.scripts.run(q.calls.fail(tid, token, "boom", now_ms=T0))
    q.scripts.run(q.calls.reap(now_ms=T0 + 10_000))  # the backoff is over: queued again
    again = claim(q, "w2", 80, now_ms=T0 + 10_000)
    assert again is not None and again["attempt"] == "2"
    e2 = emitter(q, tid, int(again["token"]))
    e2.emit("A")
    e2.emit("B")
    q.scripts.run(q.calls.ack(tid, int(again["token"]), "2"))
    chunks = list(q.task(tid).stream(timeout=1))
    assert [(c.data, c.attempt, c.seq, c.restart) for c in chunks] == [
        ("a", 1, 0, False), ("A", 2, 0, True), ("B", 2, 1, False)]


# -- the reader's bookkeeping ----------------------------------------------------------

def reply(*entries: tuple[str, dict[str, str]]) -> list[Any]:
    return [["gpuq:{s}:stream:t", list(entries)]]


def entry(n: int, token: int, seq: int, data: Any = None) -> tuple[str, dict[str, str]]:
    return (f"{n}-0", {"attempt": "1", "token": str(token), "seq": str(seq),
                       "data": json.dumps(data if data is not None else n)})


def test_follow_applies_the_attempt_rule() -> None:
    f = Follow(Queue(fakeredis.FakeRedis(decode_responses=True)).keys, "t", None, None)
    f.started("running")
    assert f.block_ms() is None  # catch up first, without blocking
    got = f.take(reply(entry(1, 7, 0), entry(2, 7, 1), entry(3, 7, 1), entry(4, 9, 0),
                       entry(5, 9, 1), ("6-0", {"foreign": "x"})))
    assert [(c.data, c.token, c.restart) for c in got] == [(1, 7, False), (2, 7, False),
                                                          (4, 9, True), (5, 9, False)]
    assert f.last_id == "6-0" and not f.done
    assert f.block_ms() is not None  # caught up: the next read blocks
    assert f.take(reply(("7-0", {"end": "succeeded"}), entry(8, 9, 2))) == []
    assert f.done and f.last_id == "7-0"


def test_follow_reads_an_ended_task_to_its_end_without_blocking() -> None:
    f = Follow(Queue(fakeredis.FakeRedis(decode_responses=True)).keys, "t", 0, None)
    f.started("failed")
    assert f.block_ms() is None
    assert [c.data for c in f.take(reply(entry(1, 3, 0)))] == [1]
    assert f.block_ms() is None and not f.done
    assert f.take([]) == [] and f.done


def test_xread_replies_in_every_shape() -> None:
    flat = [["k", [["1-0", ["seq", "0", "data", "1"]]]]]
    resp3 = {"k": [[("1-0", {"seq": "0", "data": "1"})]]}
    unified = {b"k": [(b"1-0", {b"seq": b"0", b"data": b"1"})]}
    for shape in (flat, resp3, unified, reply(("1-0", {"seq": "0", "data": "1"}))):
        assert entries_of(shape) == [("1-0", {"seq": "0", "data": "1"})], shape
    assert entries_of(None) == [] and entries_of({}) == []


def test_a_chunk_is_its_data_and_its_run() -> None:
    c = Chunk({"x": 1}, attempt=2, seq=3, token=9)
    assert not c.restart and c.data == {"x": 1}


# -- views -----------------------------------------------------------------------------

def test_status_and_top_show_running_tasks_progress(q: Queue) -> None:
    tid, token = running(q)
    q.redis.zadd(q.keys.workers, {"w1": 2e15})
    q.redis.sadd(q.keys.worker_tasks("w1"), tid)
    emitter(q, tid, token).progress(0.456, "chunk 4 of 10")
    view = pool_view(q.redis, q.keys)
    assert view.progress == {tid: {"fraction": 0.456, "message": "chunk 4 of 10"}}
    frame = render_top(view, [], width=80, now=T0 / 1000)
    assert f"progress: {tid[-8:]} 46% chunk 4 of 10" in frame.splitlines()


def test_a_yield_reruns_with_the_same_attempt_and_the_reader_sees_a_restart(q: Queue) -> None:
    tid, token = running(q)
    emitter(q, tid, token).emit("before")
    q.scripts.run(q.calls.requeue(tid, token, "yielded to a higher-priority task",
                                  preempted="yielded"))
    again = claim(q, "w1", 80)
    assert again is not None and again["attempt"] == "1" and int(again["token"]) > token
    emitter(q, tid, int(again["token"])).emit("after")
    q.scripts.run(q.calls.ack(tid, int(again["token"]), "1"))
    chunks = list(q.task(tid).stream(timeout=1))
    assert [(c.data, c.attempt, c.seq, c.restart) for c in chunks] == [
        ("before", 1, 0, False), ("after", 1, 0, True)]


def test_a_batch_handler_streams_per_task() -> None:
    app = App("b")
    app.any_model()(lambda name: name)

    @app.handler("embed", batch=4)
    def embed(model: Any, payloads: list[Any], ctx: Any) -> list[Any]:
        for c, p in zip(ctx.contexts, payloads):
            c.emit({"for": p})
            c.progress(1.0, "embedded")
        return payloads

    mq = memory_queue()
    tasks = mq.enqueue_many([{"handler": "embed", "payload": i, "model": "m", "vram_gb": 1}
                             for i in range(3)])
    assert drain(mq, app) == 3
    for i, t in enumerate(tasks):
        assert [c.data for c in t.stream(timeout=1)] == [{"for": i}]
        assert t.progress() == (1.0, "embedded") and t.result(timeout=0) == i
