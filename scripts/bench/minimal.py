"""The minimal queue: the bar the issue measures gpuq against, and its worker process.

A task hash plus one sorted set. enqueue: HSET the hash + ZADD the queue (one pipelined round
trip); claim: one Lua call (ZPOPMIN, mark running with a lease score, return the hash); ack:
one Lua call (result into the hash, result pushed onto a per-task list, TTLs); wait: BLPOP
that list. The worker runs as ``python -m bench.minimal --url URL --name NAME [--burst]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
import uuid
from typing import Any

import redis

from bench.common import dumps
from gpuq.connection import connect

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
# mark task `id` running under a lease and return its fields (both claim paths end so)
_RUN = """
local tk = KEYS[1] .. 'task:' .. id
redis.call('HSET', tk, 'state', 'running', 'worker', ARGV[1], 'started_at', string.format('%d', now))
redis.call('ZADD', KEYS[1] .. 'running', now + tonumber(ARGV[2]), id)
return redis.call('HGETALL', tk)
"""

MQ_CLAIM = _NOW + """local popped = redis.call('ZPOPMIN', KEYS[1] .. 'queue')
if not popped[1] then return false end
local id = popped[1]""" + _RUN

# the idle path: BZPOPMIN already took the id off the queue; mark it running the same way
MQ_CLAIM_POPPED = _NOW + "local id = ARGV[3]" + _RUN

MQ_ACK = _NOW + """local id, ttl = ARGV[1], ARGV[3]
local tk = KEYS[1] .. 'task:' .. id
redis.call('ZREM', KEYS[1] .. 'running', id)
redis.call('HSET', tk, 'state', 'succeeded', 'result', ARGV[2], 'finished_at', string.format('%d', now))
redis.call('PEXPIRE', tk, ttl)
local done = KEYS[1] .. 'done:' .. id
redis.call('LPUSH', done, ARGV[2])
redis.call('PEXPIRE', done, ttl)
return 1
"""


def noop(payload: Any) -> Any:
    """The minimal queue's handler: returns its payload, like gpuq's ``sim.noop``."""
    return payload


class Minimal:
    """A minimal durable queue: task hash + one sorted set, Lua claim and ack, BLPOP result."""

    LEASE_MS = 30_000
    TTL_MS = 7 * 86400 * 1000

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.r = client
        self.name = name
        self.base = f"mq:{{{name}}}:"
        self.queue = self.base + "queue"
        self.ready = self.base + "ready"
        self._claim = client.register_script(MQ_CLAIM)
        self._claim_popped = client.register_script(MQ_CLAIM_POPPED)
        self._ack = client.register_script(MQ_ACK)

    def task_key(self, task_id: str) -> str:
        return self.base + "task:" + task_id

    def _fields(self, task_id: str, handler: str, payload: Any) -> dict[Any, Any]:
        return {"id": task_id, "handler": handler, "payload": dumps(payload), "state": "queued",
                "enqueued_at": int(time.time() * 1000)}

    def enqueue(self, handler: str, payload: Any = None) -> str:
        task_id = uuid.uuid4().hex
        fields = self._fields(task_id, handler, payload)
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self.task_key(task_id), mapping=fields)
        pipe.zadd(self.queue, {task_id: fields["enqueued_at"]})
        pipe.execute()
        return task_id

    def enqueue_many(self, items: list[tuple[str, Any]]) -> list[str]:
        ids = []
        pipe = self.r.pipeline(transaction=False)
        for handler, payload in items:
            task_id = uuid.uuid4().hex
            fields = self._fields(task_id, handler, payload)
            pipe.hset(self.task_key(task_id), mapping=fields)
            pipe.zadd(self.queue, {task_id: fields["enqueued_at"]})
            ids.append(task_id)
        pipe.execute()
        return ids

    @staticmethod
    def _pairs(reply: Any) -> dict[str, str] | None:
        if not reply:
            return None
        return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply), 2)}

    def claim(self, worker: str) -> dict[str, str] | None:
        return self._pairs(self._claim(keys=[self.base], args=[worker, self.LEASE_MS]))

    def claim_popped(self, worker: str, task_id: str) -> dict[str, str] | None:
        return self._pairs(self._claim_popped(keys=[self.base], args=[worker, self.LEASE_MS, task_id]))

    def ack(self, task_id: str, result_json: str) -> None:
        self._ack(keys=[self.base], args=[task_id, result_json, self.TTL_MS])

    def wait(self, task_id: str, timeout: float) -> Any:
        popped = self.r.blpop([self.base + "done:" + task_id], timeout=timeout)
        if not popped:
            raise TimeoutError(f"minimal task {task_id} gave no result in {timeout}s")
        return json.loads(popped[1])

    def close(self) -> None:
        self.r.close()


def worker_main(url: str, name: str, burst: bool) -> int:
    """One minimal worker process: claim, run the no-op handler, ack; idle: BZPOPMIN."""
    r = connect(url)
    mq = Minimal(r, name)
    worker = f"mq-{socket.gethostname()}-{os.getpid()}"
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    r.set(mq.ready, worker)
    while not stopping:
        fields = mq.claim(worker)
        if fields is None:
            if burst:
                break
            popped = r.bzpopmin(mq.queue, timeout=1)
            if not popped:
                continue
            fields = mq.claim_popped(worker, str(popped[1]))
            if fields is None:
                continue
        result = noop(json.loads(fields["payload"]))
        mq.ack(fields["id"], dumps(result))
    r.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one minimal-queue worker process")
    ap.add_argument("--url", required=True)
    ap.add_argument("--name", required=True, help="the queue's name (its hash tag)")
    ap.add_argument("--burst", action="store_true", help="exit once the queue is empty")
    args = ap.parse_args(argv)
    return worker_main(args.url, args.name, args.burst)


if __name__ == "__main__":
    sys.exit(main())
