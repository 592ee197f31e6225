"""Passing on a task whose handler this worker's app lacks, when another live worker runs it.

The claim does not filter by handler (docs/DECISIONS.md, "A task another worker's app
runs is passed on"), so in a pool mid-upgrade a worker of the old app may claim a task of
a handler only the new app has. Failing it would lose work another worker could do; it is
given back instead (its attempt not counted) and waits ``PASS_S`` in the delayed set, and
the runner that passed it claims nothing for as long, so one worker passes at most one
task a runner every ``PASS_S`` and cannot keep the task from the workers that run it.
A handler no live worker publishes fails the task as before: nothing would ever run it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from gpuq.clock import from_time_reply
from gpuq.scripts import Call
from gpuq.worker.presence import Presence
from gpuq.worker_record import WorkerFields

PASS_S = 1.0  # a passed task's wait before it is queued again; its runner's pause
KEEP_S = 5.0  # how long an answer is reused (a rolling upgrade passes many tasks)
SERVES = WorkerFields(("handlers", "levels"))  # what another worker runs, at which priorities


class Elsewhere:
    """Whether a live worker other than this one publishes a handler for a priority."""

    def __init__(self, presence: Presence) -> None:
        self.presence = presence
        self._known: dict[tuple[str, str], tuple[float, bool]] = {}
        self._lock = threading.Lock()

    def runs(self, handler: str, priority: str) -> bool:
        key, now = (handler, priority), time.monotonic()
        with self._lock:
            kept = self._known.get(key)
        if kept is not None and now - kept[0] < KEEP_S:
            return kept[1]
        try:
            answer = self._read(handler, priority)
        except redis.RedisError:  # not known: passed (its attempt kept), asked again next time
            return True
        with self._lock:
            self._known[key] = (now, answer)
        return answer

    def runs_task(self, fields: dict[str, str]) -> bool:
        """Whether another live worker runs the handler of this task (its hash's fields) at
        its priority."""
        return self.runs(fields.get("handler", ""), fields.get("priority", ""))

    def _read(self, handler: str, priority: str) -> bool:
        client, keys, me = self.presence.redis, self.presence.keys, self.presence.worker_id
        pipe = client.pipeline(transaction=False)
        pipe.time()  # liveness scores are on the server's clock
        pipe.zrange(keys.workers, 0, -1, withscores=True)
        clock, workers = pipe.execute()
        now_ms = from_time_reply(clock)
        live = [str(w) for w, until in workers if until > now_ms and str(w) != me]
        if not live:
            return False
        pipe = client.pipeline(transaction=False)
        for wid in live:
            SERVES.read(pipe, keys, wid)
        records = (SERVES.record(wid, reply) for wid, reply in zip(live, pipe.execute()))
        # a hash without levels (an older release's) serves every level: WorkerRecord says so
        return any(r is not None and handler in r.handlers and priority in r.levels for r in records)


def passed(pending: list[Call[Any]]) -> bool:
    """Whether a runner's unsent calls pass a task on."""
    for call in pending:  # a loop, not any() of a generator: asked once a task
        if call.script == "fail" and call.args[4] == "2":
            return True
    return False


def sit_out(sent: list[Call[Any]], stopping: threading.Event) -> list[Call[Any]]:
    """After its calls were sent: a runner that passed a task on waits PASS_S (less if the
    worker stops) before it claims again. Returns what is left unsent: nothing."""
    if passed(sent):
        stopping.wait(PASS_S)
    return []
