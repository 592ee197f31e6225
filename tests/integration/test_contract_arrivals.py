"""Contract suite, part 6: enqueue counts arrivals per model in minute buckets (the forecast's
history), one HINCRBY per model per call. Each test runs on fakeredis and on the real server
(the ``backend`` fixture)."""

from __future__ import annotations

import pytest
from helpers import T0, enqueue, enqueue_specs, spec

from gpuq import Queue
from gpuq.errors import DuplicateTask
from gpuq.keys import ARRIVAL_BUCKET_MS, ARRIVAL_TTL_S
from gpuq.reaper.forecast import bucket_of, forecasts
from gpuq.reaper.scale import Scaler, forecast_settings, read_snapshot

BUCKET = T0 // ARRIVAL_BUCKET_MS


def counts(q: Queue, bucket: int = BUCKET) -> dict[str, int]:
    return {str(m): int(n) for m, n in q.redis.hgetall(q.keys.arrivals(bucket)).items()}


def test_enqueue_counts_each_model_in_its_minute(queue: Queue) -> None:
    enqueue(queue, T0, model="a")
    enqueue(queue, T0 + 1_000, model="a", priority="online")  # handed over or queued: counted
    bulk = [spec(model="a") for _ in range(3)] + [spec(model="b") for _ in range(2)]
    enqueue_specs(queue, bulk, now_ms=T0 + 2_000)
    assert counts(queue) == {"a": 5, "b": 2}
    enqueue(queue, T0 + ARRIVAL_BUCKET_MS, model="b")  # the next minute has its own hash
    assert counts(queue, BUCKET + 1) == {"b": 1}
    assert counts(queue) == {"a": 5, "b": 2}


def test_a_bucket_expires_after_the_history_the_forecast_reads(queue: Queue) -> None:
    enqueue(queue, T0, model="a")
    ttl = queue.redis.ttl(queue.keys.arrivals(BUCKET))
    assert ARRIVAL_TTL_S - 5 <= ttl <= ARRIVAL_TTL_S


def test_a_rejected_call_counts_nothing(queue: Queue) -> None:
    enqueue(queue, T0, model="a", task_id="dup")
    with pytest.raises(DuplicateTask):
        enqueue_specs(queue, [spec(model="a"), spec(model="a", task_id="dup")], now_ms=T0)
    assert counts(queue) == {"a": 1}


def test_the_scaler_reads_the_buckets_into_forecasts(queue: Queue) -> None:
    """Five minutes of one task a second for "a": the scaler's snapshot carries its rate."""
    for minute in range(5):
        enqueue_specs(queue, [spec(model="a") for _ in range(60)], now_ms=T0 + minute * ARRIVAL_BUCKET_MS)
    now = T0 + 5 * ARRIVAL_BUCKET_MS
    scaler = Scaler(queue.redis, queue.keys, queue.config)
    scaler.step(now)
    assert set(scaler.arrivals) >= set(range(BUCKET, BUCKET + 4))  # complete: kept, not read again
    got = read_snapshot(queue.redis, queue.keys, now, queue.config).forecasts
    want = forecasts({bucket_of(T0 + m * ARRIVAL_BUCKET_MS): {"a": 60} for m in range(5)}, now, {},
                     forecast_settings(queue.config))
    assert got == want and 0.3 < got["a"].level_per_s < 1.0  # the empty minutes before count
