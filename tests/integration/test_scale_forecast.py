"""The scaler's forecast against the real server: yesterday's burst raises today's desired
count ahead of it, in the scale hash, the hook's environment and the exporter's metric."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from helpers import enqueue_specs, spec

from gpuq import Queue, worker_record
from gpuq.keys import ARRIVAL_BUCKET_MS
from gpuq.reaper.scale import Scaler
from gpuq.reaper.scale_hook import CommandHook
from gpuq.views.exporter import read_figures
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.presence import Presence

MakeQueue = Callable[..., Queue]
DAY_MS = 86_400_000
NOW = 1_800_000_000_000 - 1_800_000_000_000 % ARRIVAL_BUCKET_MS


def env_appender(path: Path) -> str:
    code = ("import os, sys; f = open(sys.argv[1], 'a'); f.write(' '.join(sys.argv[2:]) + ' ' + "
            "os.environ.get('GPUQ_FORECAST_PER_S', '-') + ' ' + os.environ['GPUQ_SCALE_REASON'].split()[0]"
            " + chr(10)); f.close()")
    return shlex.join([sys.executable, "-c", code, str(path)])


def test_yesterdays_burst_raises_desired_before_it_comes(make_real_queue: MakeQueue, tmp_path: Path) -> None:
    out = tmp_path / "calls"
    # no margin: the class asks for all the forecast load needs (1 GPU-s/s at 0.5: 2 workers)
    q = make_real_queue(min_workers=1, on_scale=env_appender(out), forecast_utilisation=0.5,
                        forecast_margin=0.0)
    info = GpuInfo("A100-80", "uuid-w", 80, None, "declared")
    Presence(q.redis, q.keys, "w").register(
        worker_record.identity("w", info, 5.0, 1, "0123", "h", 1, handlers=["h"]), 400 * DAY_MS)
    q.redis.zadd(q.keys.idle, {"w": 75})
    # yesterday: a little of model bg all along, then 10 tasks a minute of model m from 2 min on
    yday = NOW - DAY_MS
    for minute in range(-30, 10):
        at = yday + minute * ARRIVAL_BUCKET_MS
        enqueue_specs(q, [spec(model="bg", est_s=1)] + [spec(model="m", est_s=6) for _ in range(
            10 if minute >= 2 else 0)], now_ms=at)
    for minute in range(-30, 0):  # today: bg only, so far
        enqueue_specs(q, [spec(model="bg", est_s=1)], now_ms=NOW + minute * ARRIVAL_BUCKET_MS)
    q.redis.delete(*[q.keys.queue(2, m) for m in ("bg", "m")], q.keys.models_with_work, q.keys.need)
    scaler = Scaler(q.redis, q.keys, q.config)
    scaler.est_s["m"] = 6.0  # what an earlier round sampled
    result = scaler.step(NOW)
    scale = {str(k): json.loads(v) for k, v in q.redis.hgetall(q.keys.scale).items()}
    m = scale["model:m"]  # no queued task of m yet: the forecast alone
    assert m["current"] == 0 and m["desired"] >= 1 and m["reason"].startswith("forecast")
    assert m["forecast_per_s"] > m["rate_per_s"] == 0
    cls = scale["class:A100-80"]
    assert cls["desired"] > cls["current"] == 1 and cls["reason"].startswith("forecast")
    assert [s.name for s in result.signals if s.kind == "model"] == ["m"]
    assert isinstance(scaler.hook, CommandHook)
    scaler.hook.wait(10)
    line = out.read_text().split()
    assert line[:3] == ["A100-80", "1", str(cls["desired"])] and float(line[3]) > 0
    assert line[4] == "forecast"
    figures = read_figures(q.redis, q.keys)
    assert ("model", "m", 0.0, m["forecast_per_s"]) in figures.forecast
