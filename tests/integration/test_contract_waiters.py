"""Contract suite: a task's done list only for tasks someone waits on (wait.lua, lib/finish.lua).

Runs on fakeredis and on the real server (``backend``), the tests that block in a BLMOVE while
another thread acts on the real server only (``real_queue``): an end nobody waits on leaves
no done list; a waiter registered before the end is woken by it; one that registers after the
end finds the element at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers import T0, ack, claim, enqueue, fail, reap

from gpuq import Queue
from gpuq.errors import TaskFailed, TaskNotFound
from gpuq.task import State

LEASE_MS = 30_000  # Config.lease_s default
TTL_MS = 7 * 24 * 3600 * 1000  # Config.result_ttl_s default


def claimed(queue: Queue, now_ms: int = T0) -> dict[str, str]:
    c = claim(queue, "w1", 40, now_ms=now_ms)
    assert c is not None
    return c


def register(queue: Queue, tid: str) -> str:
    return queue.scripts.run(queue.calls.wait(tid))


# each way a task ends: the task made ready to end, and the call that ends it
Ending = tuple[str, Callable[[], Any]]


def by_ack(q: Queue) -> Ending:
    tid = enqueue(q, T0)
    c = claimed(q)
    return tid, lambda: ack(q, tid, c["token"], {"n": 1}, now_ms=T0 + 1)


def by_fail(q: Queue) -> Ending:
    tid = enqueue(q, T0)
    c = claimed(q)
    return tid, lambda: fail(q, tid, c["token"], retry=False, now_ms=T0 + 1)


def by_cancel(q: Queue) -> Ending:
    tid = enqueue(q, T0)
    return tid, lambda: q.scripts.run(q.calls.cancel(tid, now_ms=T0 + 1))


def by_expiry(q: Queue) -> Ending:
    tid = enqueue(q, T0, deadline_s=1)
    return tid, lambda: q.scripts.run(q.calls.expire(now_ms=T0 + 5000))


def by_lost_last_lease(q: Queue) -> Ending:
    tid = enqueue(q, T0, max_attempts=1)
    claimed(q)
    return tid, lambda: reap(q, now_ms=T0 + LEASE_MS + 1)


ENDS: list[tuple[Callable[[Queue], Ending], State]] = [
    (by_ack, State.SUCCEEDED), (by_fail, State.FAILED), (by_cancel, State.CANCELED),
    (by_expiry, State.EXPIRED), (by_lost_last_lease, State.FAILED)]
IDS = ["ack", "fail", "cancel", "expire", "reap"]


@pytest.mark.parametrize("how, state", ENDS, ids=IDS)
def test_an_end_nobody_waits_on_leaves_no_done_list(queue: Queue, how: Any, state: State) -> None:
    tid, end = how(queue)
    end()
    assert queue.record(tid).state is state
    assert queue.redis.exists(queue.keys.done(tid)) == 0
    assert queue.redis.hget(queue.keys.task(tid), "waited") is None


@pytest.mark.parametrize("how, state", ENDS, ids=IDS)
def test_a_waiter_registered_before_the_end_finds_it_pushed(queue: Queue, how: Any,
                                                            state: State) -> None:
    tid, end = how(queue)
    assert register(queue, tid) in ("queued", "running")
    assert queue.redis.hget(queue.keys.task(tid), "waited") == "1"
    assert queue.redis.exists(queue.keys.done(tid)) == 0
    end()
    done = queue.keys.done(tid)
    assert queue.redis.lrange(done, 0, -1) == [state.value]
    assert 0 < queue.redis.pttl(done) <= TTL_MS


def test_the_end_wakes_a_waiter_blocked_on_another_connection(real_queue: Queue) -> None:
    queue = real_queue  # fakeredis does not block a BLMOVE
    tid, end = by_ack(queue)
    assert register(queue, tid) == "running"
    done = queue.keys.done(tid)
    blocker = type(queue.redis)(connection_pool=queue.redis.connection_pool)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(blocker.blmove(done, done, 5, "RIGHT", "LEFT")))
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive() and got == []  # blocked: nothing pushed yet
    end()
    waiter.join(5)
    assert got == ["succeeded"]
    assert queue.redis.lrange(done, 0, -1) == ["succeeded"]  # rotated in place: still there


@pytest.mark.parametrize("how, state", ENDS, ids=IDS)
def test_a_waiter_that_registers_after_the_end_finds_it_at_once(queue: Queue, how: Any,
                                                                state: State) -> None:
    tid, end = how(queue)
    end()
    assert register(queue, tid) == state.value
    done, task = queue.keys.done(tid), queue.keys.task(tid)
    assert queue.redis.lrange(done, 0, -1) == [state.value]
    assert abs(queue.redis.pttl(done) - queue.redis.pttl(task)) < 1000  # expires with the task
    assert register(queue, tid) == state.value  # a second waiter pushes nothing more
    assert queue.redis.llen(done) == 1
    t0 = time.monotonic()
    assert queue.redis.blmove(done, done, 2, "RIGHT", "LEFT") == state.value
    assert time.monotonic() - t0 < 1
    assert queue.redis.hget(task, "waited") is None  # an ended task is not marked


def test_an_ended_task_without_a_ttl_gets_a_done_list_without_one(queue: Queue) -> None:
    tid, end = by_ack(queue)
    end()
    queue.redis.persist(queue.keys.task(tid))
    assert register(queue, tid) == "succeeded"
    assert queue.redis.pttl(queue.keys.done(tid)) == -1


def test_registering_for_an_unknown_task_is_not_found_and_writes_nothing(queue: Queue) -> None:
    with pytest.raises(TaskNotFound):
        register(queue, "nope")
    assert queue.redis.exists(queue.keys.task("nope"), queue.keys.done("nope")) == 0
    with pytest.raises(TaskNotFound):  # the read before the first pop says so
        queue.result("nope", timeout=1)
    with pytest.raises(TaskNotFound):  # no read first: the registration says so
        queue.wait("nope", timeout=0.2, exists=True)


def test_waiting_registers_and_wakes_on_the_end(real_queue: Queue) -> None:
    q = real_queue
    tid, end = by_ack(q)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(q.result(tid, timeout=10, exists=True)))
    waiter.start()
    deadline = time.monotonic() + 5
    while q.redis.hget(q.keys.task(tid), "waited") != "1" and time.monotonic() < deadline:
        time.sleep(0.01)
    end()
    waiter.join(10)
    assert got == [{"n": 1}]
    assert q.wait(tid, timeout=1).state is State.SUCCEEDED


def test_an_ended_task_s_result_comes_at_once(queue: Queue) -> None:
    tid, end = by_fail(queue)
    end()
    t0 = time.monotonic()
    with pytest.raises(TaskFailed):
        queue.result(tid, timeout=5, exists=True)
    assert queue.wait(tid, timeout=5, exists=True).state is State.FAILED
    assert time.monotonic() - t0 < 2


def test_a_waiter_after_a_flush_still_reads_the_end(queue: Queue) -> None:
    """The registration finds its code missing and is sent again after the pop: that pop
    times out (nothing pushed the done list), then the read sees the end."""
    tid, end = by_ack(queue)
    end()
    if queue.scripts.sender.fcall:
        queue.redis.execute_command("FUNCTION", "FLUSH")
    else:
        queue.redis.script_flush()
    assert queue.result(tid, timeout=0.5, exists=True) == {"n": 1}
    assert queue.redis.lrange(queue.keys.done(tid), 0, -1) == ["succeeded"]  # the resent one
    assert queue.result(tid, timeout=5, exists=True) == {"n": 1}


def test_a_requeued_waited_task_pushes_again_at_its_next_end(queue: Queue) -> None:
    tid, end = by_fail(queue)
    register(queue, tid)
    end()
    assert queue.redis.lrange(queue.keys.done(tid), 0, -1) == ["failed"]
    assert queue.requeue(tid) == "queued"
    assert queue.redis.exists(queue.keys.done(tid)) == 0  # no waiter sees the old end
    c = claimed(queue, T0 + 2)
    ack(queue, tid, c["token"], "again", now_ms=T0 + 3)
    assert queue.redis.lrange(queue.keys.done(tid), 0, -1) == ["succeeded"]


def test_an_older_waiter_that_does_not_register_reads_the_end_after_its_pop(queue: Queue) -> None:
    """The pop and read alone (a client before wait.lua): the pop times out, the read sees
    the terminal state."""
    tid, end = by_ack(queue)
    end()
    done, task = queue.keys.done(tid), queue.keys.task(tid)
    pipe = queue.redis.pipeline(transaction=False)
    pipe.blmove(done, done, 0.2, "RIGHT", "LEFT")
    pipe.hget(task, "state")
    assert pipe.execute() == [None, "succeeded"]
