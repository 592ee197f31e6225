"""The exporter's per-model series cap: the deepest queues (most loads, most workers desired)
keep their own series, the rest are summed as model "other", and nothing goes uncounted."""

from __future__ import annotations

import fakeredis
from helpers import register_worker
from prometheus_client import CollectorRegistry, generate_latest

from gpuq import Queue
from gpuq.clock import server_ms
from gpuq.config import Config
from gpuq.metrics import PoolCollector
from gpuq.views.exporter import OTHER, TopLoads, read_figures


def test_the_most_loaded_models_keep_their_series() -> None:
    loads = [("b", 5, 50.0), ("a", 5, 40.0), ("c", 1, 9.0), ("d", 2, 20.0)]
    assert TopLoads(2)(loads) == [("a", 5, 40.0), ("b", 5, 50.0), (OTHER, 3, 29.0)]
    assert TopLoads(4)(loads) == sorted(loads, key=lambda m: (-m[1], m[0]))


def test_the_other_load_counters_never_fall() -> None:
    """Regression: the models were ranked anew each scrape, so one rising into the top took
    its count out of ``other``, which Prometheus reads as a counter reset."""
    top = TopLoads(1)
    assert top([("a", 10, 10.0), ("b", 5, 50.0), ("c", 4, 40.0)]) == [
        ("a", 10, 10.0), (OTHER, 9, 90.0)]
    assert top([("a", 10, 10.0), ("b", 11, 110.0), ("c", 4, 40.0)]) == [
        ("a", 10, 10.0), (OTHER, 15, 150.0)]  # b stays in other, a keeps its series
    # a shown model leaves the catalog (unused for its TTL): its series ends, and other keeps
    # its models, so it does not fall; a model new to the exporter takes the free slot
    assert top([("b", 11, 110.0), ("c", 4, 40.0)]) == [(OTHER, 15, 150.0)]
    assert top([("b", 11, 110.0), ("c", 4, 40.0), ("d", 1, 1.0)]) == [("d", 1, 1.0), (OTHER, 15, 150.0)]
    # a model of other leaves the catalog: other keeps its count
    assert top([("b", 12, 120.0), ("d", 1, 1.0)]) == [("d", 1, 1.0), (OTHER, 16, 160.0)]


def test_a_model_named_other_is_counted_once_in_the_summed_row() -> None:
    """Regression: a real model "other" got a series of its own beside the summed row of the
    same labels; Prometheus kept one and a pool's depths summed short (6 of 8 queued)."""
    assert TopLoads(2)([("other", 9, 9.0), ("a", 1, 1.0)]) == [("a", 1, 1.0), (OTHER, 9, 9.0)]
    q = Queue(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"))
    q.enqueue_many([{"handler": "h", "model": m, "vram_gb": 1, "priority": "P2"}
                    for m in ["other"] * 3 + ["m1"] * 3 + ["m2", "m3"]])
    p2 = [row for row in read_figures(q.redis, q.keys, keep=2).queues if row[0] == "P2"]
    assert [row[1] for row in p2].count(OTHER) == 1
    assert sum(row[2] for row in p2) == 8


def test_a_pool_of_many_models_exports_a_bounded_number_of_series() -> None:
    q = Queue(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"))
    q.enqueue_many([{"handler": "h", "model": f"m{i:03d}", "vram_gb": 1, "priority": "P2"}
                    for i in range(300) for _ in range(1 + i % 3)])
    figures = read_figures(q.redis, q.keys, keep=20)
    p2 = [row for row in figures.queues if row[0] == "P2"]
    assert len(p2) == 21 and p2[-1][1] == OTHER
    assert sum(row[2] for row in p2) == sum(1 + i % 3 for i in range(300))
    assert {row[2] for row in p2[:-1]} == {3}  # the deepest queues keep their own series
    assert p2[-1][3] >= max(row[3] for row in p2[:-1])  # other: its oldest head (enqueued first)
    registry = CollectorRegistry()
    registry.register(PoolCollector(lambda: figures))
    series = [line for line in generate_latest(registry).decode().splitlines()
              if line and not line.startswith("#")]
    assert len([s for s in series if s.startswith("gpuq_queue_depth{")]) == 21 + 3  # + empty levels
    assert len(series) < 200


def test_a_corrupt_queued_task_does_not_break_a_scrape_or_status() -> None:
    """Regression: an ``enqueued_at`` that was not an integer (a foreign write) at a queue's
    head made every scrape answer 500 and ``gpuq status`` print a traceback."""
    q = Queue(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"))
    for bad in ("abc", "1.5e12", "nan"):
        t = q.enqueue("h", model=f"m-{bad}", vram_gb=1)
        q.redis.hset(q.keys.task(t.id), "enqueued_at", bad)
    figures = read_figures(q.redis, q.keys)
    assert sum(row[2] for row in figures.queues) == 3
    assert all(row[3] >= 0 for row in figures.queues)


def test_tenant_series_are_capped_to_the_registered_and_the_busiest_others() -> None:
    """Regression: every tenant name a producer sent (tenancy on, registration not required)
    made series of its own, without a bound."""
    from gpuq.tenants import Tenant, set_tenant

    q = Queue(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"))
    set_tenant(q, Tenant("paying", 2.0))
    q.enqueue_many([{"handler": "h", "model": "m", "vram_gb": 1, "tenant": f"t{i:02d}"}
                    for i in range(30) for _ in range(1 + i % 4)])
    names = [t["name"] for t in read_figures(q.redis, q.keys, keep=5).tenants]
    assert names[0] == "paying" and len(names) == 6
    assert set(names[1:]) <= {f"t{i:02d}" for i in range(30) if i % 4 == 3}


def test_every_worker_state_of_a_class_is_exported_zero_too() -> None:
    """Found by a QA pass: with every worker idle the busy series vanished (an alert on it
    goes silent rather than reading 0)."""
    q = Queue(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"))
    register_worker(q, "w1", idle=True)
    workers = read_figures(q.redis, q.keys).workers
    assert workers == {("A100", "idle"): 1, ("A100", "busy"): 0, ("A100", "draining"): 0,
                       ("A100", "silent"): 0, ("A100", "dead"): 0}
    # three beats missed, its liveness not lapsed yet: silent
    q.redis.hset(q.keys.worker("w1"), mapping={"heartbeat_ms": 5000, "seen_at": server_ms(q.redis) - 16_000})
    workers = read_figures(q.redis, q.keys).workers
    assert (workers[("A100", "silent")], workers[("A100", "idle")]) == (1, 0)


def test_a_foreign_writers_malformed_figures_break_no_scrape_or_status() -> None:
    """Found by a QA pass: a `stats` field that was not an integer, a scale signal whose
    desired count was not a number, or a catalog entry whose loads were not one made every
    scrape answer 503 and ``gpuq status`` and ``gpuq top`` print a traceback (the reaper
    logged one a round). The malformed figure is left out; the others are still shown."""
    from gpuq.views.inspect import pool_view
    from gpuq.views.render import render_status

    q = Queue(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"))
    q.enqueue("h", model="m", vram_gb=1)
    q.redis.hset(q.keys.stats, mapping={"sla_met:P2": "x", "sla_missed:P2": "1.5", "sla_met:P1": 2})
    q.redis.hset(q.keys.scale, mapping={"class:X": '{"desired": "a"}',
                                        "model:Y": '{"desired": 2, "rate_per_s": "x", "forecast_per_s": 1}',
                                        "class:Z": '{"desired": 3, "current": 1}'})
    q.redis.sadd(q.keys.catalog, "bad", "good")
    q.redis.hset(q.keys.catalog_model("bad"), mapping={"loads": "abc", "vram_gb": 1, "total_load_s": "x"})
    q.redis.hset(q.keys.catalog_model("good"), mapping={"loads": 2, "vram_gb": 1, "total_load_s": 3})
    figures = read_figures(q.redis, q.keys)
    assert figures.stats["enqueued"] == 1 and figures.stats["sla_met:P1"] == 2
    assert "sla_met:P2" not in figures.stats
    assert figures.desired == [("class", "Z", 1, 3), ("model", "Y", 0, 2)]
    assert ("good", 2, 3.0) in figures.model_loads and ("bad", 0, 0.0) in figures.model_loads
    registry = CollectorRegistry()
    registry.register(PoolCollector(lambda: figures))
    assert b'gpuq_sla_attainment_ratio{pool="p",priority="P1"} 1.0' in generate_latest(registry)
    assert "P1 100.0%" in render_status(pool_view(q.redis, q.keys))


def test_a_producers_foreign_writes_to_the_index_and_arrivals_break_nothing() -> None:
    """Found by a security review: ``ZADD models 1 garbage`` (the producer role may write its
    pool's keys) made status exit with a traceback, every scrape answer 503 and the reaper's
    scale step fail each round; so did an arrivals count that was not a number."""
    from gpuq.clock import server_ms
    from gpuq.reaper.scale import Scaler
    from gpuq.views.inspect import pool_view

    q = Queue(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"))
    q.enqueue("h", model="m", vram_gb=1)
    q.redis.zadd(q.keys.models_with_work, {"garbage": 1, "9:x": 2, "2:": 3})
    bucket = server_ms(q.redis) // 60_000
    q.redis.hset(q.keys.arrivals(bucket), mapping={"m": "garbage", "n": "2"})
    assert [(row[0], row[1]) for row in read_figures(q.redis, q.keys).queues if row[2]] == [("P2", "m")]
    assert [v.model for v in pool_view(q.redis, q.keys).queues] == ["m"]
    Scaler(q.redis, q.keys, q.config).step()  # no exception: the malformed count is left out


def test_scale_signals_no_reaper_rewrote_leave_the_desired_series_and_say_how_old() -> None:
    """Regression: after the reaper stopped, the exporter kept exporting the last round's
    gpuq_workers_desired (and the per-model signals and forecasts) for ever, so an autoscaler
    reading it kept acting on a stale figure. Stale signals (as `gpuq status` heads them) are
    left out; their age is exported, fresh or stale, for an alert."""
    import json

    q = Queue(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"))

    def scrape(age_s: float) -> str:
        at = int(q.redis.time()[0] * 1000 - age_s * 1000)
        q.redis.hset(q.keys.scale, mapping={
            "class:L4": json.dumps({"current": 1, "desired": 10, "at": at}),
            "model:m": json.dumps({"current": 1, "desired": 4, "rate_per_s": 1.0,
                                   "forecast_per_s": 2.0, "at": at})})
        registry = CollectorRegistry()
        registry.register(PoolCollector(lambda: read_figures(q.redis, q.keys)))
        return generate_latest(registry).decode()

    fresh = scrape(1.0)
    assert 'gpuq_workers_desired{gpu_class="L4",pool="p"} 10.0' in fresh
    assert 'gpuq_model_workers_desired{model="m",pool="p"} 4.0' in fresh
    assert "gpuq_scale_signal_age_seconds{" in fresh
    stale = scrape(300.0)
    for family in ("gpuq_workers_desired", "gpuq_workers_current", "gpuq_model_workers_desired",
                   "gpuq_arrivals_forecast_per_second"):
        assert f"{family}{{" not in stale, family
    (age,) = [line for line in stale.splitlines() if line.startswith("gpuq_scale_signal_age_seconds{")]
    assert 299.0 <= float(age.split()[-1]) < 400.0


def scale_series(q: Queue) -> dict[str, float]:
    """The scale signals' age, its bound and the desired workers, as one scrape exports them."""
    registry = CollectorRegistry()
    registry.register(PoolCollector(lambda: read_figures(q.redis, q.keys)))
    return {line.split("{")[0]: float(line.split()[-1])
            for line in generate_latest(registry).decode().splitlines()
            if line.startswith(("gpuq_scale_signal", "gpuq_workers_desired{"))}


def test_the_staleness_bound_is_exported_beside_the_age_and_follows_the_reapers_rounds() -> None:
    """Regression: GpuqScaleSignalsStale compared the age with a fixed 60 s, so a reaper with
    rounds of 180 s or more set it off between its own rounds. The exporter exports the bound
    it judges staleness by, for the rule to compare the age with."""
    import json

    q = Queue(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"))

    def scrape(age_s: float, every_s: float | None) -> dict[str, float]:
        at = int(q.redis.time()[0] * 1000 - age_s * 1000)
        signal = {"current": 1, "desired": 3, "at": at} | ({} if every_s is None else {"every_s": every_s})
        q.redis.hset(q.keys.scale, "class:L4", json.dumps(signal))
        return scale_series(q)

    assert scrape(1.0, None)["gpuq_scale_signal_stale_after_seconds"] == 15.0
    between_rounds = scrape(600.0, 300.0)  # two of a 300 s reaper's rounds: still fresh
    assert between_rounds["gpuq_scale_signal_stale_after_seconds"] == 900.0
    assert between_rounds["gpuq_workers_desired"] == 3.0
    assert "gpuq_workers_desired" not in scrape(1000.0, 300.0)  # past the bound: stale
    q.redis.delete(q.keys.scale)
    assert scale_series(q) == {}  # no signal with a time: neither the age nor its bound


def test_a_queues_oldest_wait_counts_from_when_its_head_became_queued() -> None:
    """Found by an integrator: a task delayed 20 s showed a wait of 26.9 s seven seconds after
    it became due (and a retried or yielded task, its wait since its first enqueue), so the
    "queue wait growing" alert fired for any task delayed over a minute."""
    q = Queue(fakeredis.FakeRedis(decode_responses=True), Config(pool="p"))
    t = q.enqueue("h", model="m", vram_gb=1, priority="P2")
    now = server_ms(q.redis)
    q.redis.hset(q.keys.task(t.id), mapping={"enqueued_at": now - 60_000, "queued_at": now - 5_000})
    (row,) = [r for r in read_figures(q.redis, q.keys).queues if r[:2] == ("P2", "m")]
    assert 5 <= row[3] < 30
