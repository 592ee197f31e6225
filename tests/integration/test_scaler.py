"""The scaler against the real server: signals in the scale hash, the hook command, warm hints."""

from __future__ import annotations

import json
import logging
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import register_worker as register

from gpuq import Config, Queue, catalog
from gpuq.claims import ClaimRequest
from gpuq.clock import server_ms
from gpuq.keys import ARRIVAL_TTL_S
from gpuq.reaper.loop import Reaper
from gpuq.reaper.scale import Scaler
from gpuq.reaper.scale_hook import CommandHook
from gpuq.views.inspect import pool_view
from gpuq.views.render import render_status

MakeQueue = Callable[..., Queue]


def enqueue(q: Queue, n: int, model: str, vram_gb: float, est_s: float = 1.0,
            priority: str = "P2") -> None:
    q.enqueue_many([{"handler": "h", "model": model, "vram_gb": vram_gb, "est_s": est_s,
                     "priority": priority} for _ in range(n)])


def scale_hash(q: Queue) -> dict[str, dict[str, Any]]:
    return {str(k): json.loads(v) for k, v in q.redis.hgetall(q.keys.scale).items()}


def appender(path: Path) -> str:
    """A hook command that appends its arguments to ``path`` as one line."""
    code = ("import sys; f = open(sys.argv[1], 'a'); "
            "f.write(' '.join(sys.argv[2:]) + chr(10)); f.close()")
    return shlex.join([sys.executable, "-c", code, str(path)])


def test_signals_replace_the_scale_hash(make_real_queue: MakeQueue) -> None:
    q = make_real_queue(min_workers=0)
    register(q, "w-h", "A100-80", 80, holds=("m",))
    enqueue(q, 120, "m", 16, est_s=2)
    q.redis.hset(q.keys.scale, "model:gone", "{}")
    plan = Scaler(q.redis, q.keys, q.config).step()
    got = scale_hash(q)
    assert set(got) == {"class:A100-80", "model:m"}
    assert got["model:m"]["current"] == 1 and got["model:m"]["desired"] == 4
    assert got["model:m"]["reason"] == "backlog 120 tasks, 240 s of work"
    assert (got["class:A100-80"]["current"], got["class:A100-80"]["desired"]) == (1, 4)
    assert got["class:A100-80"]["at"] > 1_600_000_000_000  # the server's clock, in ms
    assert [s.hash_field for s in plan.signals] == ["class:A100-80", "model:m"]
    assert plan.hints == []


def test_a_round_reads_a_bounded_number_of_tasks_and_keeps_the_rest(make_real_queue: MakeQueue) -> None:
    q = make_real_queue(min_workers=0)
    register(q, "w-h", "A100-80", 80)
    for i in range(30):  # each queue: 5 tasks of 1, 1, 1, 1 and 11 s, 15 s of work in all
        q.enqueue_many([{"handler": "h", "model": f"m{i}", "vram_gb": 16, "est_s": est,
                         "priority": "P2"} for est in (1, 1, 1, 1, 11)])
    scaler = Scaler(q.redis, q.keys, q.config)
    scaler.samples.budget = 60  # 150 task reads wanted: 30 heads, then 7 queues in full a round

    def hmgets() -> int:
        return int(q.redis.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0))

    for _ in range(5):
        before = hmgets()
        scaler.step()
        assert hmgets() - before <= 60 + 1  # the budget, and the worker's hash
    reasons = {k: v["reason"] for k, v in scale_hash(q).items() if k.startswith("model:")}
    assert len(reasons) == 30 and set(reasons.values()) == {"backlog 5 tasks, 15 s of work"}


def test_a_queued_task_is_read_once_while_it_stays_in_the_sample(make_real_queue: MakeQueue) -> None:
    q = make_real_queue(min_workers=0)
    register(q, "w-h", "A100-80", 80)
    for i in range(3):
        enqueue(q, 5, f"m{i}", 16, est_s=3)
    scaler = Scaler(q.redis, q.keys, q.config)

    def hmgets() -> int:
        return int(q.redis.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0))

    before = hmgets()
    scaler.step()
    assert hmgets() - before == 15 + 1  # every task, and the worker's hash
    before = hmgets()
    scaler.step()
    assert hmgets() - before == 1  # the tasks as read: none changes while it stays queued
    enqueue(q, 1, "m0", 16, est_s=30)  # a new task joins m0's sample
    before = hmgets()
    scaler.step()
    assert hmgets() - before == 1 + 1
    reasons = {k: v["reason"] for k, v in scale_hash(q).items() if k.startswith("model:")}
    assert reasons == {"model:m0": "backlog 6 tasks, 45 s of work",
                       "model:m1": "backlog 5 tasks, 15 s of work",
                       "model:m2": "backlog 5 tasks, 15 s of work"}


def test_a_round_reads_no_reservation_while_the_claims_gate_says_none_is_live(
        make_real_queue: MakeQueue) -> None:
    """preempt.lua moves `reserved_until` with each reservation it makes (lib/gates.lua):
    past it, no worker's reservation key is read, and no worker counts as reserved."""
    q = make_real_queue(min_workers=0)
    enqueue(q, 6, "m", 30)
    register(q, "w-a", "A100-40", 40, idle=True)
    now = server_ms(q.redis)
    q.redis.set(q.keys.reservation("w-a"), f"t-other {now + 60_000}")  # as preempt.lua writes it

    def mgets() -> int:
        return int(q.redis.info("commandstats").get("cmdstat_mget", {}).get("calls", 0))

    q.redis.hset(q.keys.fairness, "reserved_until", str(now - 1))  # every reservation ended
    before = mgets()
    assert [h.worker for h in Scaler(q.redis, q.keys, q.config).step().hints] == ["w-a"]
    assert mgets() == before
    q.redis.delete(q.keys.control("w-a"))
    q.redis.hset(q.keys.fairness, "reserved_until", str(now + 60_000))
    assert Scaler(q.redis, q.keys, q.config).step().hints == []  # held for t-other: no hint
    assert mgets() == before + 1


def test_hook_command_gets_class_current_desired_when_desired_changes(
        make_real_queue: MakeQueue, tmp_path: Path) -> None:
    out = tmp_path / "calls"
    q = make_real_queue(min_workers=0, on_scale=appender(out))
    register(q, "w-h", "L4", 24, holds=("m",))
    scaler = Scaler(q.redis, q.keys, q.config)
    assert isinstance(scaler.hook, CommandHook)
    scaler.step()  # desired == current: nothing to tell
    enqueue(q, 120, "m", 16, est_s=2)
    scaler.step()
    scaler.step()  # unchanged: told once
    enqueue(q, 60, "m", 16, est_s=2)
    scaler.step()
    scaler.hook.wait(10)
    assert out.read_text().splitlines() == ["L4 1 4", "L4 1 6"]


def test_failing_hook_is_logged_and_never_raises(make_real_queue: MakeQueue,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    q = make_real_queue(min_workers=1)
    caplog.set_level(logging.WARNING, logger="gpuq.reaper.scale")
    for command in (f"{shlex.quote(sys.executable)} -c 'raise SystemExit(3)'", "/nonexistent/gpuq-hook"):
        hook = CommandHook(command)
        hook("L4", 0, 1)
        hook.wait(10)
        assert hook.run("L4", 0, 1) is False
    assert sum("scale.hook_failed" in r.getMessage() for r in caplog.records) == 4

    def broken(cls: str, current: int, desired: int) -> None:
        raise RuntimeError("boom")

    q.redis.hset(q.keys.classes, "L4", 19)
    Scaler(q.redis, q.keys, q.config, hook=broken).step()  # min_workers 1 asks L4 for one
    assert scale_hash(q)["class:L4"]["desired"] == 1


def test_task_too_big_for_live_workers_raises_the_smallest_fitting_class(make_real_queue: MakeQueue) -> None:
    q = make_real_queue(min_workers=0)
    register(q, "w-l4", "L4", 24)
    q.redis.hset(q.keys.classes, mapping={"A100-80": 75, "H200": 136})  # registered earlier
    enqueue(q, 2, "big", 40)
    enqueue(q, 1, "huge", 200)
    Scaler(q.redis, q.keys, q.config).step()
    got = scale_hash(q)
    assert (got["class:A100-80"]["current"], got["class:A100-80"]["desired"]) == (0, 1)
    assert "2 tasks fit no live worker" in got["class:A100-80"]["reason"]
    assert (got["class:H200"]["desired"], got["class:L4"]["desired"]) == (0, 1)
    assert got["unschedulable"] == {"tasks": 1, "largest_gb": 200.0, "largest_gpus": 1,
                                   "class_gb": 136.0}


def test_with_no_class_known_no_task_is_unschedulable(make_real_queue: MakeQueue) -> None:
    """Producers before any worker (a pool's bring-up): the defect called every queued task
    larger than the largest class, which was no class at all."""
    q = make_real_queue(min_workers=0)
    enqueue(q, 1, "m", 4)
    Scaler(q.redis, q.keys, q.config).step()
    got = scale_hash(q)
    assert "unschedulable" not in got and got["model:m"]["desired"] == 1


def test_tasks_whose_handler_no_live_worker_registers_are_named(make_real_queue: MakeQueue) -> None:
    q = make_real_queue(min_workers=0)
    register(q, "w-l4", "L4", 24)
    q.enqueue_many([{"handler": h, "model": "m", "vram_gb": 4} for h in ("h", "nope.x", "nope.x", "asr")])
    Scaler(q.redis, q.keys, q.config).step()
    assert scale_hash(q)["unregistered"] == {"asr": 1, "nope.x": 2}
    register(q, "w-asr", "L4", 24)  # registers "h" only
    q.redis.hset(q.keys.worker("w-asr"), "handlers", "asr,h")
    Scaler(q.redis, q.keys, q.config).step()
    assert scale_hash(q)["unregistered"] == {"nope.x": 2}


def test_warm_hint_goes_to_the_right_worker_once(make_real_queue: MakeQueue) -> None:
    q = make_real_queue(min_workers=0)
    enqueue(q, 6, "m", 30)
    register(q, "w-holder", "A100-80", 80, holds=("m",))
    register(q, "w-small", "L4", 24, idle=True)
    register(q, "w-tight", "A100-40", 40, idle=True)
    register(q, "w-lane", "A100-40b", 40, idle=True, levels="0")
    register(q, "w-big", "H200", 141, idle=True)
    scaler = Scaler(q.redis, q.keys, q.config)
    plan = scaler.step()
    assert [(h.worker, h.model) for h in plan.hints] == [("w-tight", "m")]
    assert q.redis.lrange(q.keys.control("w-tight"), 0, -1) == ["preload m 30"]
    # a worker that left after the snapshot never deletes the list its hint recreated
    assert 0 < q.redis.pttl(q.keys.control("w-tight")) <= 60_000
    for other in ("w-small", "w-lane", "w-big", "w-holder"):
        assert q.redis.llen(q.keys.control(other)) == 0
    assert q.redis.hget(q.keys.stats, "warm_hints") == "1"
    assert scaler.step().hints == []  # hinted within the last 30 s
    assert q.redis.llen(q.keys.control("w-tight")) == 1


def test_warm_hint_names_the_catalog_footprint(make_real_queue: MakeQueue) -> None:
    q = make_real_queue(min_workers=0)
    enqueue(q, 4, "m", 16)
    register(q, "w-holder", "L4", 24, holds=("m",))
    register(q, "w-idle", "L4", 24, idle=True)
    pipe = q.redis.pipeline()
    catalog.record_load(pipe, q.keys, "m", 14.5, 3.0)
    pipe.execute()
    Scaler(q.redis, q.keys, q.config).step()
    assert q.redis.lrange(q.keys.control("w-idle"), 0, -1) == ["preload m 14.5"]


def test_a_warm_hint_passes_over_an_idle_worker_skipping_the_model(make_real_queue: MakeQueue) -> None:
    """Regression: the scaler took an idle worker whose claims skip a model (its load failed
    there lately: its `lanes` entry lists it) for one that takes the model's work: the
    model's warm hint went to it, which passed the preload over, and no other was hinted
    for HINT_EVERY_MS."""
    q = make_real_queue(min_workers=0)
    enqueue(q, 4, "m", 16)
    register(q, "w-holder", "L4", 24, holds=("m",))
    register(q, "w-skipper", "L4", 24, idle=True)  # the tightest fit
    register(q, "w-idle", "A100-80", 80, idle=True)
    request = ClaimRequest("w-skipper", 19, 0, 1, skipped=[("m", 60_000)])
    assert q.scripts.run(q.calls.claim(request, now_ms=server_ms(q.redis))).task is None  # lists m
    plan = Scaler(q.redis, q.keys, q.config).step()
    assert [(h.worker, h.model) for h in plan.hints] == [("w-idle", "m")]


def test_dead_and_draining_workers_do_not_count(make_real_queue: MakeQueue) -> None:
    q = make_real_queue(min_workers=0)
    register(q, "w-live", "L4", 24)
    register(q, "w-dead", "L4", 24)
    register(q, "w-leaving", "L4", 24)
    q.redis.zadd(q.keys.workers, {"w-dead": 1})
    q.redis.hset(q.keys.worker("w-leaving"), "state", "draining")
    Scaler(q.redis, q.keys, q.config).step()
    assert scale_hash(q)["class:L4"]["current"] == 1


def test_default_config_has_no_hook(make_real_queue: MakeQueue) -> None:
    q = make_real_queue()
    assert Scaler(q.redis, q.keys, Config(pool=q.config.pool)).hook is None


def test_pool_view_shows_reservations_yield_requests_and_scale(make_real_queue: MakeQueue) -> None:
    q = make_real_queue(min_workers=0)
    register(q, "w-1", "A100-80", 80, holds=("m",), levels="01")
    register(q, "w-2", "L4", 24, idle=True)
    register(q, "w-dead", "L4", 24)
    q.redis.zadd(q.keys.workers, {"w-dead": 1})
    now_ms = int(time.time() * 1000)
    q.redis.hset(q.keys.task("running-on-w-1"), mapping={"state": "running",
                                                         "yield_by": now_ms + 5000,
                                                         "yield_for": "t-wait"})
    q.redis.hset(q.keys.task("running-on-w-dead"), mapping={"state": "running",
                                                            "yield_by": now_ms + 5000})
    q.redis.set(q.keys.reservation("w-1"), f"t-wait {now_ms + 10_000}")
    q.redis.set(q.keys.reservation("w-2"), f"t-gone {now_ms - 1}")  # expired: not shown
    q.redis.set(q.keys.reservation("w-dead"), f"t-other {now_ms + 10_000}")
    enqueue(q, 10, "m", 16, est_s=30)
    Scaler(q.redis, q.keys, q.config).step()

    v = pool_view(q.redis, q.keys)
    assert v.reservations == [{"worker": "w-1", "task": "t-wait"}]
    (y,) = v.yield_requests
    assert (y["task"], y["worker"], y["for"]) == ("running-on-w-1", "w-1", "t-wait")
    assert 3 < y["yield_by_s"] <= 5
    assert v.scale["model:m"]["desired"] == 5 and v.scale["class:A100-80"]["current"] == 1
    assert {w.id: w.levels for w in v.workers} == {"w-1": "01", "w-2": "0123", "w-dead": "0123"}
    json.dumps(v.to_dict())
    text = render_status(v)
    assert "w-1 held for t-wait" in text and "running-on-w-1 on w-1: yield within" in text
    assert "scale signals:" in text


def test_the_catalog_is_read_a_page_a_round_and_whole_over_a_pass(make_real_queue: MakeQueue) -> None:
    q = make_real_queue()
    names = [f"m{i:03d}" for i in range(200)]  # past a small set's one-reply encoding
    pipe = q.redis.pipeline()
    for i, name in enumerate(names):
        catalog.record_load(pipe, q.keys, name, 10 + i, 1 + i / 100)
    pipe.execute()
    pages = catalog.CatalogPages(page=16)
    got, rounds = pages.read(q.redis, q.keys), 1
    assert len(got) < len(names)  # one round reads a page, not the catalog
    while pages.cursor:
        before = len(got)
        got, rounds = pages.read(q.redis, q.keys), rounds + 1
        assert len(got) - before <= 3 * 16
    assert rounds > 4 and got == catalog.read(q.redis, q.keys)
    q.redis.srem(q.keys.catalog, "m007")  # left the catalog: forgotten after the next pass
    got = pages.read(q.redis, q.keys)
    assert "m007" in {e.name for e in got}
    while pages.cursor:
        got = pages.read(q.redis, q.keys)
    assert got == catalog.read(q.redis, q.keys) and "m007" not in {e.name for e in got}


def test_a_catalog_entry_unused_for_its_ttl_leaves_the_catalog(make_real_queue: MakeQueue) -> None:
    """The defect: the catalog kept a set member and a hash for every model ever loaded."""
    q = make_real_queue()
    pipe = q.redis.pipeline()
    for name in ("kept", "gone"):
        catalog.record_load(pipe, q.keys, name, 10, 2.0)
    pipe.execute()
    assert 0 < q.redis.pttl(q.keys.catalog_model("gone")) <= catalog.TTL_MS
    q.redis.delete(q.keys.catalog_model("gone"))  # as its TTL ends: no load nor holder since
    assert [e.name for e in catalog.read(q.redis, q.keys)] == ["kept"]
    assert [e.name for e in catalog.CatalogPages().read(q.redis, q.keys)] == ["kept"]
    assert q.redis.smembers(q.keys.catalog) == {"kept"}  # the reaper's pass took the name out


def test_holders_are_read_for_a_bounded_number_of_forecast_models(
        make_real_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuq.keys import ARRIVAL_BUCKET_MS
    from gpuq.reaper import scale
    monkeypatch.setattr(scale, "MODELS_PER_LEVEL", 2)
    q = make_real_queue(min_workers=0, scale_signal="forecast")
    now = 1_800_000_000_000 - 1_800_000_000_000 % ARRIVAL_BUCKET_MS
    for minute in range(-10, 0):  # arrivals only, none queued: a history per model
        for model, n in (("a", 8), ("b", 4), ("c", 2), ("d", 1), ("e", 1)):
            q.redis.hincrby(q.keys.arrivals(now // ARRIVAL_BUCKET_MS + minute), model, n)
    enqueue(q, 1, "q", 16)
    snap = scale.read_snapshot(q.redis, q.keys, now, q.config)
    assert set(snap.forecasts) >= {"a", "b", "c", "d", "e"}  # the class forecast weighs all
    ranked = sorted((m for m in snap.forecasts if m != "q"),
                    key=lambda m: (not snap.forecasts[m].rising, -snap.forecasts[m].forecast_per_s, m))
    assert snap.weighed == frozenset({"q", *ranked[:2]}) == frozenset(snap.holders)


def test_a_class_size_that_is_no_finite_number_is_passed_over(make_real_queue: MakeQueue) -> None:
    """An older worker could declare nan or inf GB: the round's reads took it as a score
    bound, which the server refuses, and every round failed."""
    q = make_real_queue(min_workers=0)
    register(q, "w-h", "A100-80", 80, holds=("m",))
    q.redis.hset(q.keys.classes, mapping={"broken": "nan", "huge": "inf"})
    enqueue(q, 10, "m", 16, est_s=2)
    plan = Scaler(q.redis, q.keys, q.config).step()
    assert "class:A100-80" in {s.hash_field for s in plan.signals}


def test_work_of_a_tenant_at_its_cap_asks_for_no_workers(make_real_queue: MakeQueue) -> None:
    """Regression: the scaler counted a capped tenant's backlog, which no claim would take:
    it asked for 21 workers for 20 tasks of a tenant allowed no GPU, and the new workers
    idled out and were asked for again."""
    from gpuq.tenants import Tenant, set_tenant

    q = make_real_queue(min_workers=0)
    register(q, "w-h", "A100-80", 80, holds=("m",))
    set_tenant(q, Tenant("free", 1.0))
    q.enqueue_many([{"handler": "h", "model": "m", "vram_gb": 16, "est_s": 6, "priority": "P2",
                     "tenant": "capped"} for _ in range(20)])
    set_tenant(q, Tenant("capped", 1.0, 0, None))  # after: enqueue refuses a task past the caps
    Scaler(q.redis, q.keys, q.config).step()
    got = scale_hash(q)
    assert (got["class:A100-80"]["current"], got["class:A100-80"]["desired"]) == (1, 1)
    assert "model:m" not in got or got["model:m"]["desired"] <= 1
    q.enqueue_many([{"handler": "h", "model": "m", "vram_gb": 16, "est_s": 6, "priority": "P2",
                     "tenant": "free"} for _ in range(20)])
    Scaler(q.redis, q.keys, q.config).step()
    got = scale_hash(q)  # the free tenant's 20 tasks (120 s of work) still ask for workers
    assert got["class:A100-80"]["desired"] > 1


def test_estimates_of_models_long_gone_are_forgotten(make_real_queue: MakeQueue) -> None:
    """The defect: the scaler kept a model's mean est_s for as long as the reaper ran, one
    entry per model ever queued, copied into every round's snapshot."""
    q = make_real_queue(min_workers=0)
    for i in range(5):
        enqueue(q, 1, f"gone{i}", 4, est_s=3.0)
    scaler = Scaler(q.redis, q.keys, q.config)
    now = server_ms(q.redis)
    scaler.step(now_ms=now)
    assert {f"gone{i}" for i in range(5)} <= set(scaler.est_s)
    for key in q.redis.scan_iter(match=q.keys.queue(2, "*")):  # as if every task had ended
        q.redis.delete(key)
    enqueue(q, 1, "stays", 4, est_s=2.0)
    scaler.step(now_ms=now + 3_600_000)  # a season may bring them back: still known
    assert {f"gone{i}" for i in range(5)} <= set(scaler.est_s)
    scaler.step(now_ms=now + ARRIVAL_TTL_S * 1000 + 60_000)  # past every arrival a forecast reads
    assert set(scaler.est_s) == {"stays"}


def test_work_across_two_gpus_asks_for_the_group_class(make_real_queue: MakeQueue) -> None:
    """The defect: the scale step weighed a task's VRAM only, so 60 GB tasks over two GPUs
    asked for more one-GPU 80 GB workers (1 -> 6), which cannot run them, and only one
    more group of two."""
    q = make_real_queue(min_workers=0)
    register(q, "one", "A100-80", 80)
    register(q, "pair", "A100-80", 80, gpus=2)
    q.enqueue_many([{"handler": "h", "model": "tp", "vram_gb": 60, "est_s": 30, "priority": "P2",
                     "gpus": 2} for _ in range(20)])
    Scaler(q.redis, q.keys, q.config).step()
    got = scale_hash(q)
    assert (got["class:A100-80"]["current"], got["class:A100-80"]["desired"]) == (1, 1)
    assert got["class:2xA100-80"]["current"] == 1 and got["class:2xA100-80"]["desired"] > 2
    assert "tp +" in got["class:2xA100-80"]["reason"]


def test_parked_tasks_across_more_gpus_than_any_live_group_ask_for_a_group(
        make_real_queue: MakeQueue) -> None:
    """Tasks over two GPUs while only one-GPU workers live: parked out of their queues, they
    still raise the smallest registered class that holds them, and are not unschedulable."""
    q = make_real_queue(min_workers=0)
    register(q, "one", "A100-80", 80)
    q.redis.hset(q.keys.classes, "2xA100-80", 150)  # a group registered earlier, none live now
    q.redis.hset(q.keys.class_gpus, "2xA100-80", 2)
    q.enqueue_many([{"handler": "h", "model": "tp", "vram_gb": 60, "priority": "P2", "gpus": 2}
                    for _ in range(3)])
    reaper = Reaper(q.redis, q.config)
    reaper.scaler.step()
    assert reaper.park() == (3, 0)
    reaper.scaler.step()
    got = scale_hash(q)
    assert (got["class:2xA100-80"]["current"], got["class:2xA100-80"]["desired"]) == (0, 1)
    assert "3 tasks fit no live worker" in got["class:2xA100-80"]["reason"]
    assert (got["class:A100-80"]["current"], got["class:A100-80"]["desired"]) == (1, 1)
    assert "unschedulable" not in got
    view = pool_view(q.redis, q.keys)
    assert (view.parked, view.unschedulable) == (3, 0)
    q.redis.hdel(q.keys.class_gpus, "2xA100-80")  # as if that class were one GPU: none holds them
    reaper.scaler.step()
    assert scale_hash(q)["unschedulable"] == {"tasks": 3, "largest_gb": 60.0,
                                                    "largest_gpus": 2, "class_gb": 150.0}
    view = pool_view(q.redis, q.keys)
    assert view.unschedulable == 3 and "more VRAM or GPUs than any" in render_status(view)


def test_a_model_of_shapes_no_one_class_holds_is_sized_for_its_widest(make_real_queue: MakeQueue) -> None:
    """Found by a QA pass: a model with 60 GB one-GPU tasks and 30 GB two-GPU tasks needed
    (60 GB, 2 GPUs), which no class has, and got no signal at all."""
    q = make_real_queue(min_workers=0)
    register(q, "w1", "A100", 80)  # 75 GB usable
    register(q, "w2", "A10", 24, gpus=2)  # 38 GB usable over two
    q.enqueue_many([{"handler": "h", "model": "M", "vram_gb": v, "est_s": 600, "priority": "P2",
                     "gpus": g} for v, g in [(60, 1), (30, 2)] * 5])
    plan = Scaler(q.redis, q.keys, q.config).step()
    got = scale_hash(q)
    assert got["model:M"]["desired"] > 1 and "M +" in got["class:2xA10"]["reason"]
    assert plan.unschedulable == 0


def test_the_wide_sample_sees_the_widest_class_behind_many_narrower_tasks(
        make_real_queue: MakeQueue) -> None:
    """Found by a QA pass: 300 parked tasks over two GPUs filled the sample of the fewest
    GPUs first, and the eight-GPU class a parked task asked for was never raised."""
    q = make_real_queue(min_workers=0)
    register(q, "one", "A100", 80)
    q.redis.hset(q.keys.classes, mapping={"2xA100": 150, "8xA100": 600})
    q.redis.hset(q.keys.class_gpus, mapping={"2xA100": 2, "8xA100": 8})
    q.enqueue_many([{"handler": "h", "model": "tp", "vram_gb": 100, "priority": "P2", "gpus": 2}
                    for _ in range(300)] + [{"handler": "h", "model": "big", "vram_gb": 500,
                                              "priority": "P2", "gpus": 8}])
    reaper = Reaper(q.redis, q.config)
    reaper.scaler.step()
    reaper.park()
    reaper.scaler.step()
    got = scale_hash(q)
    assert (got["class:8xA100"]["desired"], got["class:2xA100"]["desired"]) == (1, 1)
    assert "1 tasks fit no live worker" in got["class:8xA100"]["reason"]


def test_the_unschedulable_size_is_of_a_task_no_class_holds(make_real_queue: MakeQueue) -> None:
    """Found by a QA pass: with a 70 GB task a class held and a task over eight GPUs none
    did, the scale hash said the largest unschedulable task needed 70 GB."""
    q = make_real_queue(min_workers=0)
    register(q, "one", "A100", 80)  # 75 GB usable, the only class
    q.enqueue_many([{"handler": "h", "model": "m", "vram_gb": 70, "priority": "P2"},
                    {"handler": "h", "model": "w", "vram_gb": 10, "priority": "P2", "gpus": 8}])
    Scaler(q.redis, q.keys, q.config).step()
    assert scale_hash(q)["unschedulable"] == {"tasks": 1, "largest_gb": 10.0,
                                                    "largest_gpus": 8, "class_gb": 75.0}


def test_a_forecast_hint_never_preloads_a_group_model_onto_one_gpu(make_real_queue: MakeQueue) -> None:
    """QA: a 2-GPU model whose tasks ran at once on a group (never sampled in a queue) was
    preloaded by the forecast onto an idle one-GPU worker, which can never run its tasks:
    the catalog now keeps the GPUs the task that loaded it asked."""
    from gpuq.keys import ARRIVAL_BUCKET_MS
    q = make_real_queue(min_workers=0, scale_signal="forecast")
    now = server_ms(q.redis)
    for minute in range(-10, 1):  # one task of "wide" a minute, none queued now
        q.redis.hincrby(q.keys.arrivals(now // ARRIVAL_BUCKET_MS + minute), "wide", 1)
    register(q, "g2", "A100", 80, gpus=2, holds=("other",))  # busy: no idle worker holds "wide"
    register(q, "s1", "A100", 80, idle=True)
    pipe = q.redis.pipeline()
    catalog.record_load(pipe, q.keys, "wide", 70, 1.0, gpus=2)
    pipe.execute()
    assert catalog.read(q.redis, q.keys)[0].gpus == 2
    plan = Scaler(q.redis, q.keys, q.config).step(now_ms=now)
    assert [(h.worker, h.model) for h in plan.hints if h.model == "wide"] == []
    assert q.redis.llen(q.keys.control("s1")) == 0
    # the same model loaded for a one-GPU task: a one-GPU worker may take it
    pipe = q.redis.pipeline()
    catalog.record_load(pipe, q.keys, "wide", 70, 1.0, gpus=1)
    pipe.execute()
    plan = Scaler(q.redis, q.keys, q.config).step(now_ms=now)
    assert [(h.worker, h.model) for h in plan.hints] == [("s1", "wide")]
