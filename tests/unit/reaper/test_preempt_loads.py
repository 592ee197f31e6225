"""What the planner counts a worker's running tasks to use (gpuq.reaper.preempt.worker_loads),
on fakeredis: tasks sharing a loaded model count its weights once."""

from __future__ import annotations

import fakeredis

from gpuq.keys import Keys
from gpuq.reaper.preempt import worker_loads

KEYS = Keys("pl")


def row(worker: str, vram: float, model: str, state: str = "running") -> list[str | None]:
    """A running task's fields as read_workers reads them (vram_gb and model last)."""
    return [state, "1", worker, "3", "0", "5", "1", "0", None, None, str(vram), model]


def test_a_batch_of_one_model_counts_its_weights_once_and_a_victim_frees_only_its_own_memory() -> None:
    """Regression: four tasks of a 4 GB model on a 19 GB GPU (a batch) counted 16 GB, so no
    P0 task of 10 GB could ever be planned against them; the worker uses 4 GB + 4 x 1."""
    client = fakeredis.FakeRedis(decode_responses=True)
    client.hset(KEYS.catalog_model("bge"), "vram_gb", "4")
    tasks = [row("w", 5, "bge") for _ in range(4)] + [row("v", 6, "llm")]
    load, frees, _ = worker_loads(client, KEYS, tasks)
    assert load == {"w": 8.0, "v": 6.0}
    assert frees == [1.0, 1.0, 1.0, 1.0, 6.0]  # the weights stay while the others use them
    _, _, shares = worker_loads(client, KEYS, tasks)
    assert shares == [(4.0, 4)] * 4 + [(0.0, 1)]  # all four ending free the weights too


def test_without_a_catalog_entry_each_task_counts_whole() -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    load, frees, _ = worker_loads(client, KEYS,
                                  [row("w", 5, "m"), row("w", 3, "m"), row("w", 2, "x", "queued")])
    assert load == {"w": 8.0} and frees[:2] == [5.0, 3.0]


def test_a_footprint_larger_than_a_tasks_need_counts_no_more_than_that_need() -> None:
    client = fakeredis.FakeRedis(decode_responses=True)
    client.hset(KEYS.catalog_model("m"), "vram_gb", "30")
    load, _, _ = worker_loads(client, KEYS, [row("w", 10, "m"), row("w", 12, "m")])
    assert load == {"w": 12.0}  # weights at most 10: 10 + 0 + 2
