"""Contract suite: periodic tasks (gpuq.schedule, fire.lua) under a virtual clock.

A period's run is enqueued once whoever fires it and however often; periods missed while
no reaper ran give one run (the latest), or none with skip_missed. Each test runs on
fakeredis and on the real server (``backend``).
"""

from __future__ import annotations

import json

import pytest
import redis
import redis.asyncio
from helpers import T0, claim, enqueue_specs, spec

from gpuq import Queue
from gpuq import schedule as sched
from gpuq.errors import ConnectionFailed, InvalidTask, ScheduleError
from gpuq.keys import Keys
from gpuq.task import State
from gpuq.tenants import Tenant, require_registered, set_tenant


def add(q: Queue, name: str = "nightly", anchor: int = T0, **options: object) -> sched.Schedule:
    options.setdefault("model", "A")
    options.setdefault("vram_gb", 1)
    s = sched.add(q.redis, q.keys, name, "h", {"n": 1}, **options)  # type: ignore[arg-type]
    # pin the anchor to the virtual clock (add reads the server's)
    text = q.redis.hget(q.keys.schedules, name)
    q.redis.hset(q.keys.schedules, name, text.replace(str(s.anchor_ms), str(anchor)))
    return s


def fire(q: Queue, now: int) -> int:
    return sched.fire_due(q.redis, q.keys, q.scripts, q.calls, now_ms=now)


def runs(q: Queue) -> list[str]:
    return sorted(k.split(":task:", 1)[1] for k in q.redis.scan_iter(match=q.keys.task("*")))


def test_every_fires_once_per_period(queue: Queue) -> None:
    add(queue, every="10s")
    assert fire(queue, T0 + 9_999) == 0
    assert fire(queue, T0 + 10_000) == 1
    assert fire(queue, T0 + 15_000) == 0  # the same period again: nothing
    assert fire(queue, T0 + 20_500) == 1
    assert runs(queue) == [f"nightly@{T0 + 10_000}", f"nightly@{T0 + 20_000}"]
    rec = queue.record(f"nightly@{T0 + 10_000}")
    assert rec.state is State.QUEUED and rec.schedule == f"nightly {T0 + 10_000}"
    assert rec.payload == {"n": 1}
    c = claim(queue, "w1", 20, now_ms=T0 + 21_000)
    assert c is not None and c["id"] == f"nightly@{T0 + 10_000}"


def test_a_damaged_schedule_does_not_keep_the_others_from_firing(queue: Queue) -> None:
    """Regression: a stored schedule whose task the fire script refused, or whose cron did
    not parse, raised out of the round: every schedule after it by name never fired."""
    add(queue, "a-bad", every="10s")
    add(queue, "b-good", every="10s")
    stored = json.loads(queue.redis.hget(queue.keys.schedules, "a-bad"))
    stored["task"]["priority"] = 9
    queue.redis.hset(queue.keys.schedules, "a-bad", json.dumps(stored))
    assert fire(queue, T0 + 10_000) == 1
    queue.redis.hset(queue.keys.schedules, "a-bad", json.dumps({**stored, "cron": "bogus",
                                                                 "every_ms": None}))
    assert fire(queue, T0 + 20_000) == 1
    assert runs(queue) == [f"b-good@{T0 + 10_000}", f"b-good@{T0 + 20_000}"]


@pytest.mark.parametrize("damage", [
    {"payload": json.dumps("x" * (1 << 20 + 1))}, {"payload": "{not json"}, {"model": "m1,m2"},
    {"model": "red\x1b[31m"}, {"handler": ""}, {"tenant": "a b"}, {"tenant": 7}, {"vram_gb": -5},
    {"gpus": 65}, {"gpus": 1.5}, {"max_attempts": 0}, {"est_s": -1}, {"deadline_ms": 0}])
def test_a_stored_task_enqueue_would_refuse_is_not_fired(queue: Queue, damage: dict[str, object]) -> None:
    """Found by a security review: a producer (HSET on `schedules`) could make the reaper
    enqueue a 3 MiB payload, a model with a comma, a space and an escape in it, a run id with a
    newline, or a negative VRAM need: the fire script took the stored task as it stood."""
    add(queue, "nightly", every="10s")
    stored = json.loads(queue.redis.hget(queue.keys.schedules, "nightly"))
    queue.redis.hset(queue.keys.schedules, "nightly", json.dumps({**stored, "task": {**stored["task"], **damage}}))
    assert fire(queue, T0 + 10_000) == 0
    assert runs(queue) == []
    queue.redis.hset(queue.keys.schedules, "bad\nname", json.dumps(stored))  # the run's id: a name too
    assert fire(queue, T0 + 20_000) == 0 and runs(queue) == []
    queue.redis.hset(queue.keys.schedules, "minus", "-1")  # JSON, not a mapping: left out, no traceback
    assert [s.name for s in sched.list_schedules(queue.redis, queue.keys)] == ["bad\nname", "nightly"]


def test_two_reapers_firing_the_same_period_enqueue_one_run(queue: Queue) -> None:
    add(queue, every="1m")
    period = T0 + 60_000
    calls = [sched.fire_call(queue.calls, "nightly", period, now_ms=period + 5) for _ in range(2)]
    replies = queue.scripts.pipelined(calls)  # both in one round trip, back to back
    assert [c.parse(r) for c, r in zip(calls, replies)] == [f"nightly@{period}", "done"]
    assert runs(queue) == [f"nightly@{period}"]


def test_missed_periods_give_one_run_on_return(queue: Queue) -> None:
    add(queue, every="1m")
    assert fire(queue, T0 + 60_000 * 10 + 30_000) == 1  # ten periods passed: the latest runs
    assert runs(queue) == [f"nightly@{T0 + 600_000}"]
    assert fire(queue, T0 + 60_000 * 10 + 40_000) == 0


def test_skip_missed_skips_a_late_period_and_fires_the_next(queue: Queue) -> None:
    add(queue, every="10m", skip_missed=True)
    assert fire(queue, T0 + 600_000 + sched.GRACE_MS + 1) == 0
    assert runs(queue) == []
    assert fire(queue, T0 + 1_200_000 + 500) == 1
    assert runs(queue) == [f"nightly@{T0 + 1_200_000}"]


def test_cron_fires_on_matching_minutes(queue: Queue) -> None:
    add(queue, cron="*/5 * * * *", anchor=T0)  # T0 is 22:13:20 UTC
    first = (T0 // 300_000 + 1) * 300_000
    assert fire(queue, first - 1) == 0
    assert fire(queue, first + 59_000) == 1
    assert runs(queue) == [f"nightly@{first}"]


def test_a_removed_schedule_fires_no_more(queue: Queue) -> None:
    add(queue, every="10s")
    sched.remove(queue.redis, queue.keys, "nightly")
    assert fire(queue, T0 + 30_000) == 0
    with pytest.raises(ScheduleError, match="no schedule named"):
        sched.remove(queue.redis, queue.keys, "nightly")


@pytest.mark.parametrize("options, error, fragment", [
    ({"every": "500ms"}, ScheduleError, "at least 1 s"),
    ({"every": "often"}, ScheduleError, "expected a number"),
    ({"cron": "61 * * * *"}, ScheduleError, "minute field"),
    ({"every": "1m", "cron": "* * * * *"}, ScheduleError, "one of every and cron"),
    ({}, ScheduleError, "one of every and cron"),
    ({"every": "1m", "priority": "urgent"}, InvalidTask, "unknown priority"),
    ({"every": "1m", "delay_s": 5}, ScheduleError, "no delay"),
])
def test_bad_schedules_store_nothing(queue: Queue, options: dict[str, object], error: type,
                                     fragment: str) -> None:
    with pytest.raises(error, match=fragment):
        add(queue, **options)
    assert queue.redis.hlen(queue.keys.schedules) == 0


def test_a_name_is_added_once(queue: Queue) -> None:
    add(queue, every="1m")
    with pytest.raises(ScheduleError, match="exists"):
        add(queue, every="2m")
    (only,) = sched.list_schedules(queue.redis, queue.keys)
    assert only.every_ms == 60_000 and only.to_dict(T0)["next_period"] == (T0 + 60_000) / 1000


def test_a_run_arrives_as_an_enqueued_task_does(queue: Queue) -> None:
    """Counted in its model's arrivals; behind its tenant's own backlog by fair order, counted
    in its tenant's work and queued tasks."""
    set_tenant(queue, Tenant("acme", 1.0))
    enqueue_specs(queue, [spec(model="A", tenant="acme", priority=2, est_s=100) for _ in range(3)],
                  now_ms=T0)
    backlog = [float(queue.redis.hget(queue.keys.task(t), "order"))
               for t in queue.redis.zrange(queue.keys.queue(2, "A"), 0, -1)]
    work = float(queue.redis.hget(queue.keys.tenant_work, "acme"))
    add(queue, every="1m", tenant="acme", priority=2, est_s=100)
    period = T0 + 60_000
    assert fire(queue, period) == 1
    run = f"nightly@{period}"
    assert float(queue.redis.hget(queue.keys.task(run), "order")) > max(backlog)
    assert float(queue.redis.hget(queue.keys.tenant_work, "acme")) == work + 100
    assert queue.redis.hget(queue.keys.tenant_queued, "2:acme") == "4"
    assert queue.redis.hget(queue.keys.arrivals(period // 60_000), "A") == "1"


def test_a_run_of_an_unregistered_tenant_fails_where_registration_is_required(queue: Queue) -> None:
    add(queue, every="1m", tenant="ghost")
    set_tenant(queue, Tenant("acme", 1.0))
    require_registered(queue, True)
    with pytest.raises(ScheduleError, match="tenant ghost is not registered"):
        add(queue, name="later", every="1m", tenant="ghost")
    period = T0 + 60_000
    assert fire(queue, period) == 0  # the run ends failed at once, with why
    rec = queue.record(f"nightly@{period}")
    assert rec.state is State.FAILED and "tenant ghost is not registered" in (rec.error or "")
    assert queue.redis.zcard(queue.keys.queue(2, "A")) == 0


def test_a_run_past_its_tenant_s_caps_fails_and_such_a_schedule_is_refused(queue: Queue) -> None:
    """As enqueue refuses a task past its tenant's caps: a schedule whose runs the caps
    could never let start is refused, and a run fired after the caps were lowered ends
    failed with why, rather than wait unclaimed, counted in every backlog."""
    set_tenant(queue, Tenant("acme", max_vram_gb=10))
    with pytest.raises(ScheduleError, match="tenant acme could never run it: it needs 1 GPUs and 16 GB, "
                                            "the tenant's caps allow any GPUs and 10 GB"):
        add(queue, name="big", every="1m", tenant="acme", vram_gb=16)
    add(queue, every="1m", tenant="acme", vram_gb=8)
    set_tenant(queue, Tenant("acme", max_vram_gb=4))
    period = T0 + 60_000
    assert fire(queue, period) == 0
    rec = queue.record(f"nightly@{period}")
    assert rec.state is State.FAILED and "caps allow any GPUs and 4 GB" in (rec.error or "")
    assert queue.redis.zcard(queue.keys.queue(2, "A")) == 0


def test_the_schedule_api_on_a_dead_server_raises_connection_failed() -> None:
    """Found by a QA pass: add, list_schedules and remove raised redis-py's ConnectionError
    where every Queue call raises ConnectionFailed (the CLI mapped it; a program could not)."""
    dead = redis.Redis(port=1, socket_connect_timeout=0.5, decode_responses=True)
    keys = Keys("gpuq", "p")
    with pytest.raises(ConnectionFailed, match="127.0.0.1:1|localhost:1"):
        sched.add(dead, keys, "s", "h", None, every="1m", model="m", vram_gb=1)
    with pytest.raises(ConnectionFailed):
        sched.list_schedules(dead, keys)
    with pytest.raises(ConnectionFailed):
        sched.remove(dead, keys, "s")


def test_the_schedule_api_refuses_an_asyncio_client_in_one_line() -> None:
    with pytest.raises(ScheduleError, match="synchronous client"):
        sched.list_schedules(redis.asyncio.Redis(port=1), Keys("gpuq", "p"))  # type: ignore[arg-type]
