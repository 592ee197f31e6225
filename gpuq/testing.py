"""Run handlers without GPUs or a Redis server: for users' own tests.

    from gpuq.testing import memory_queue, drain
    q = memory_queue()                       # the real Lua scripts on fakeredis
    t = q.enqueue("llm.generate", {"prompt": "hi"}, model="llama3-8b", vram_gb=16)
    drain(q, app, vram_gb=80)                # claims and runs every task it can, in-process
    assert t.result(timeout=0) == {...}

Needs the test extra (``pip install gpuq[test]``) for fakeredis.
"""

from __future__ import annotations

import json
from typing import Any

from gpuq.app import App, Context
from gpuq.client import Queue
from gpuq.config import Config
from gpuq.errors import AppError
from gpuq.scripts import ClaimRequest
from gpuq.task import JSON
from gpuq.worker.models import ModelCache


def memory_queue(pool: str = "test", config: Config | None = None) -> Queue:
    import fakeredis

    cfg = config or Config(pool=pool)
    return Queue(fakeredis.FakeRedis(decode_responses=True), cfg, url="fakeredis")


def call_handler(app: App, handler: str, payload: Any = None, *, model: str,
                 vram_gb: float = 1.0, est_s: float = 0.0) -> Any:
    """Load the model and run one handler directly, as a worker would (no queue)."""
    problem = app.check(handler, model)
    if problem:
        raise AppError(problem)
    spec = app.model_spec(model)
    assert spec is not None
    ctx = Context("test", 1, "test-worker", model, vram_gb, est_s)
    return app.handlers[handler].fn(spec.load(model), payload, ctx)


def drain(queue: Queue, app: App, *, vram_gb: float = 80.0, worker_id: str = "test-worker",
          limit: int = 10_000) -> int:
    """Claim and run tasks in-process through the real scripts until none fits; returns count."""
    cache = ModelCache(app, vram_gb, queue.config.kv_reserve_gb)
    loaded: dict[str, Any] = {}
    ran = 0
    while ran < limit:
        req = ClaimRequest(worker_id, cache.free_gb(), cache.evictable_gb(), 1, cache.loaded())
        fields = queue.scripts.run(queue.calls.claim(req)).task
        if fields is None:
            return ran
        task_id, token, model = fields["id"], int(fields["token"]), fields["model"]
        ran += 1
        try:
            problem = app.check(fields["handler"], model)
            if problem:
                raise AppError(problem)
            res = cache.reserve(model, float(fields["vram_gb"]))
            if res is None:
                raise AppError(f"task needs more VRAM than {vram_gb:g} GB can free")
            for old in res.evict:
                loaded.pop(old.spec.name, None)
            if res.cold:
                cache.load(cache.get(model))
            ctx = Context(task_id, int(fields["attempt"]), worker_id, model,
                          float(fields["vram_gb"]), float(fields["est_s"]))
            try:
                result = app.handlers[fields["handler"]].fn(cache.get(model).obj,
                                                            json.loads(fields["payload"]), ctx)
            finally:
                cache.release(res)
            queue.scripts.run(queue.calls.ack(task_id, token, JSON.encode(result)))
        except Exception as exc:
            queue.scripts.run(queue.calls.fail(task_id, token, f"{type(exc).__name__}: {exc}",
                                               retry=not isinstance(exc, AppError)))
    return ran
