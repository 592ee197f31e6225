"""``gpuq task`` on a task enqueue offered to an idle worker, or handed over to one."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from test_cli import BASE, Pool

from gpuq import Config, worker_record
from gpuq.embedded import EmbeddedServer
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.loop import Worker
from workers.sim import app

HANDOVER = (5000, 5, 30_000)  # defer ms, fair_every, lease ms: enqueue may start tasks on it


@pytest.fixture
def cli_pool(redis_server: EmbeddedServer, pool: str, prefix: str) -> Iterator[Pool]:
    p = Pool(redis_server.url, pool, prefix)
    yield p
    p.redis.close()


def idle_worker(p: Pool, worker_id: str, handover: tuple[int, int, int] | None = None) -> None:
    """A one-slot worker whose claim found nothing: listed idle, for enqueue's wake rule."""
    config = Config(pool=p.name, prefix=p.prefix).validate()
    w = Worker(
        p.redis, config, app, GpuInfo("sim", f"uuid-{worker_id}", 80, None, "declared"), worker_id=worker_id
    )
    w.presence.register(
        worker_record.identity(worker_id, w.gpu, 5.0, 1, "0123", "host", 1, handover, ["sim.run"]), 30_000
    )
    assert not isinstance(w.claim(None), tuple)


def test_task_shows_the_worker_a_queued_task_was_offered_to(cli_pool: Pool) -> None:
    """Found by a QA pass: the task hash's `offered` (the idle worker enqueue woke for it,
    which other workers leave it to for its defer bound) was in neither output."""
    idle_worker(cli_pool, "w-offer")
    task_id = cli_pool.ok("enqueue", *BASE).strip()
    record = json.loads(cli_pool.ok("task", task_id, "--json"))
    assert (record["state"], record["offered"], record["pickup_by"]) == ("queued", "w-offer", None)
    assert "offered       w-offer" in cli_pool.ok("task", task_id).splitlines()


def test_task_shows_a_hand_over_s_pickup_deadline_while_unconfirmed(cli_pool: Pool) -> None:
    """Found by a QA pass: a task handed over at enqueue showed running on its worker, with
    nothing saying its worker had not picked it up yet nor when it is taken back."""
    idle_worker(cli_pool, "w-hand", HANDOVER)
    before = time.time()
    task_id = cli_pool.ok("enqueue", *BASE).strip()
    record = json.loads(cli_pool.ok("task", task_id, "--json"))
    assert (record["state"], record["worker"], record["offered"]) == ("running", "w-hand", None)
    assert before < record["pickup_by"] <= time.time() + HANDOVER[0] / 1000
    (shown,) = [line for line in cli_pool.ok("task", task_id).splitlines() if line.startswith("pickup_by")]
    assert float(shown.split()[1]) == pytest.approx(record["pickup_by"])
    (worker,) = json.loads(cli_pool.ok("status", "--json"))["workers"]
    assert worker["id"] == "w-hand" and worker["running"] == [task_id]  # as `gpuq status` shows it
