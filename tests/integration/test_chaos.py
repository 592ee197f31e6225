"""Redis going away under real worker and reaper processes, and the chaos soak (--quick).

A worker and a reaper wait out a Redis restart with backoff and say so once each (one
``redis.unavailable``, one ``redis.recovered``), not once per retry, and work on afterwards; a
worker or reaper that cannot reach Redis at start gives up with one line; a producer blocked on a
result waits the restart out too. The soak runs as
``scripts/chaos.py --quick --json`` and every invariant figure must be 0.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import ROOT, Procs, est, wait_for

from gpuq.aio import AsyncQueue
from gpuq.client import Queue
from gpuq.config import Config
from gpuq.embedded import EmbeddedServer, free_port
from gpuq.task import State

pytestmark = pytest.mark.slow

DOWN_S = 3.0  # long enough for several retries: the old loops logged once a second per thread


@pytest.fixture
def server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(appendonly=True, extra=["--appendfsync", "always"]) as s:
        yield s


def restart(server: EmbeddedServer, down_s: float) -> None:
    """kill -9, stay down, start again on the same port and directory (its append-only file)."""
    assert server.proc is not None
    server.proc.kill()
    server.proc.wait()
    server.proc = None
    time.sleep(down_s)
    server.start()


def test_worker_and_reaper_say_a_restart_once_and_recover(server: EmbeddedServer, pool: str, prefix: str,
                                                          tmp_path: Path) -> None:
    queue = Queue.from_url(server.url, pool, Config(prefix=prefix))
    with Procs(server.url, pool, prefix, tmp_path) as procs:
        worker = procs.worker("w1", concurrency=2)
        reaper = procs.reaper()
        wait_for(lambda: "reaper.active" in reaper.log(), 20, message=reaper.log)
        before = queue.enqueue("sim.noop", model="m", vram_gb=1)
        assert before.result(timeout=20) is None
        restart(server, DOWN_S)
        for proc in (worker, reaper):
            wait_for(lambda p=proc: "redis.recovered" in p.log(), 20,
                     message=lambda p=proc: f"{p.name} to recover; log:\n{p.log()[-3000:]}")
        after = queue.enqueue("sim.noop", {"n": 2}, model="m", vram_gb=1)
        assert after.result(timeout=20) == {"n": 2}
        for proc in (worker, reaper):
            log = proc.log()
            assert log.count("redis.unavailable") == 1, log
            assert log.count("redis.recovered") == 1, log
            assert "Traceback" not in log
            assert "redis_error" not in log and "heartbeat.failed" not in log
    queue.close()


def test_a_blocked_result_wait_rides_out_a_restart(server: EmbeddedServer, pool: str, prefix: str,
                                                  tmp_path: Path) -> None:
    """Regression: a producer blocked on result() raised ConnectionFailed when Redis restarted
    under it; now the wait tries again with backoff (gpuq.producer.Waiting.pause), sync and
    asyncio alike, and gets the result the worker acks once Redis is back."""
    config = Config(prefix=prefix)
    queue = Queue.from_url(server.url, pool, config)
    got: dict[str, object] = {}

    async def wait_async(task_id: str) -> object:
        async with AsyncQueue.from_url(server.url, pool=pool, config=config) as aq:
            return await aq.task(task_id).result(timeout=40)

    with Procs(server.url, pool, prefix, tmp_path) as procs:
        procs.worker("w1", concurrency=2)
        # each runs 3 s, past the restart's start
        first, second = (queue.enqueue("sim.run", model="m", vram_gb=1, est_s=est(3)) for _ in range(2))
        waiters = [threading.Thread(target=lambda: got.update(sync=first.result(timeout=40))),
                   threading.Thread(target=lambda: got.update(aio=asyncio.run(wait_async(second.id))))]
        for t in waiters:
            t.start()
        time.sleep(0.5)  # both blocked on their pops
        restart(server, DOWN_S)
        for t in waiters:
            t.join(60)
        assert set(got) == {"sync", "aio"}
        assert all(isinstance(r, dict) and r["worker"] == "w1" for r in got.values()), got


def test_a_model_load_that_ends_while_redis_is_down_still_runs_its_task(
        server: EmbeddedServer, pool: str, prefix: str, tmp_path: Path) -> None:
    """Found by a QA pass: the load's report to the pool (holders, catalog) failed on the
    outage and failed the task, its handler never run: an attempt spent on an outage (with
    max_attempts=1, the task lost). It runs now; the holdings follow at the next beat."""
    queue = Queue.from_url(server.url, pool, Config(prefix=prefix))
    with Procs(server.url, pool, prefix, tmp_path) as procs:
        worker = procs.worker("w1", vram_gb=80)
        task = queue.enqueue("sim.run", model="llama3-70b", vram_gb=70, est_s=est(1), max_attempts=1)
        procs.wait_state(task.id, State.RUNNING)
        time.sleep(2.5)  # its load takes 5.5 s: Redis is down when it ends, back after
        restart(server, DOWN_S)
        result = task.result(timeout=40)
        assert result["attempt"] == 1 and queue.record(task.id).state is State.SUCCEEDED
        assert "presence.unsent" in worker.log() and "task.failed" not in worker.log()
        wait_for(lambda: queue.redis.sismember(queue.keys.holders("llama3-70b"), "w1"), 10,
                 message="the holdings sent again")
    queue.close()


@pytest.mark.parametrize("command", [["reaper"], ["worker", "--app", "workers.sim:app", "--vram-gb", "8"]])
def test_no_redis_at_start_is_one_line_and_a_non_zero_exit(command: list[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    out = subprocess.run([sys.executable, "-m", "gpuq", "--redis", url, *command], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [out.stderr.strip()], out.stderr
    assert out.stderr.startswith("Error: cannot reach Redis"), out.stderr


@pytest.mark.timeout(300)
def test_quick_soak_loses_nothing_and_writes_nothing_twice() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "chaos.py"), "--quick", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=280, check=False)
    assert out.stdout.strip(), out.stderr[-4000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("lost_acked_enqueues", "results_written_twice", "results_without_run",
                "runs_beyond_claims", "stops_of_held_runs", "wrong_endings", "sla_counts_off",
                "started_sla_uncounted", "stuck_queued_with_idle_fit", "vram_drift_workers",
                "leftover_keys"):
        assert figures[key] == 0, (key, figures["examples"], out.stderr[-2000:])
    for key in ("worker_kills", "reaper_kills", "worker_stops", "idle_stops", "conn_kills", "handler_runs",
                "runs_stopped", "stops_past_grace"):
        assert figures[key] > 0, (key, figures)
    assert figures["redis_restarts"] >= 2 and figures["redis_kills"] >= 1
    assert figures["tasks"] == 1000 and figures["ok"] and out.returncode == 0
