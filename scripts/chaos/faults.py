"""The fault injector: a seeded plan of faults at random times, run one after another.

Faults: SIGKILL a worker (a replacement starts), SIGKILL the active reaper (a replacement
starts), SIGSTOP a worker past its lease and SIGCONT it later (any worker, or one idle in the
pool, so enqueue hands tasks over to a frozen worker), kill every client connection (CLIENT
KILL TYPE normal: workers' take-up connections among them) once a hand-over is in flight,
restart Redis (kill -9 or a clean shutdown; same port, same append-only file) once a
hand-over is in flight. A fault that waits for a hand-over waits ``HANDED_WAIT_S`` at most
and then strikes all the same; each notes the hand-overs in flight when it struck. After
each Redis restart the injector measures the recovery: the time from the server answering
again until every live worker has heartbeat and a reaper holds the lock again, both by
writes made after the restart.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from gpuq.keys import Keys

from .cluster import Cluster
from .settings import Settings

RECOVERY_LIMIT_S = 60.0
HANDED_WAIT_S = 3.0


@dataclass
class Faults:
    """What was done, counted as the report tables it."""

    events: list[dict[str, Any]] = field(default_factory=list)
    worker_kills: int = 0
    reaper_kills: int = 0
    worker_stops: int = 0
    idle_stops: int = 0
    conn_kills: int = 0
    with_handed: int = 0  # faults struck while a hand-over was in flight
    redis_restarts: int = 0
    redis_kills: int = 0
    redis_crashes: int = 0  # kills with the last second of the file lost (everysec)
    aof_bytes_cut: int = 0
    recoveries_s: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def note(self, kind: str, **fields: Any) -> None:
        self.events.append({"t": round(time.monotonic() - self.started, 2), "kind": kind,
                            "wall": time.time(), **fields})


def plan(settings: Settings, window_s: float) -> list[tuple[float, str]]:
    """(offset seconds, fault) sorted by time: the minimum counts, at seeded random times
    within the middle of the window. Redis restarts are spread apart (one per slice) so each
    recovery is measured on its own; the first is a kill -9."""
    rng = random.Random(settings.seed)
    out: list[tuple[float, str]] = []
    n = settings.redis_restarts
    for i in range(n):
        lo, hi = window_s * (0.1 + 0.8 * i / n), window_s * (0.1 + 0.8 * (i + 1) / n)
        out.append((rng.uniform(lo, hi - 0.1 * (hi - lo)), "redis_kill" if i % 2 == 0 else "redis_term"))
    for kind, count in (("reaper_kill", settings.reaper_kills), ("worker_kill", settings.worker_kills),
                        ("worker_stop", settings.worker_stops), ("idle_stop", settings.idle_stops),
                        ("conn_kill", settings.conn_kills)):
        out += [(rng.uniform(0.05, 0.9) * window_s, kind) for _ in range(count)]
    return sorted(out)


class Injector:
    def __init__(self, cluster: Cluster, settings: Settings, keys: Keys, faults: Faults) -> None:
        self.cluster = cluster
        self.settings = settings
        self.keys = keys
        self.faults = faults
        self.rng = random.Random(settings.seed + 1)
        self.probe = redis.Redis.from_url(cluster.server.url, decode_responses=True,
                                          socket_timeout=2, socket_connect_timeout=1)
        self.timers: list[threading.Timer] = []

    def run(self, schedule: list[tuple[float, str]], stop: threading.Event) -> None:
        start = time.monotonic()
        for offset, kind in schedule:
            if stop.wait(max(0.0, start + offset - time.monotonic())):
                break
            getattr(self, kind)()
        for timer in self.timers:  # continue every stopped worker before the drain
            timer.join()

    # process faults
    def _workers(self) -> list[Any]:
        return [p for p in self.cluster.live("worker") if not p.stopped]

    def worker_kill(self) -> None:
        victims = self._workers()
        if not victims:
            return
        proc = self.rng.choice(victims)
        if not self.cluster.mark_killed(proc):  # it exited by itself: already replaced
            return
        proc.signal(signal.SIGKILL)
        proc.popen.wait(10)
        new = self.cluster.replace_worker(proc)
        self.faults.worker_kills += 1
        self.faults.note("worker_kill", target=proc.name, pid=proc.popen.pid, replacement=new.name)

    def worker_stop(self) -> None:
        victims = self._workers()
        if victims:
            self._freeze(self.rng.choice(victims), "worker_stop")

    def idle_stop(self) -> None:
        """Freeze a worker idle in the pool (concurrency 1 first: enqueue hands tasks over
        only to those), so tasks are handed over to it frozen; waits HANDED_WAIT_S at most
        for one to be idle."""
        stop_at = time.monotonic() + HANDED_WAIT_S
        while time.monotonic() < stop_at:
            try:
                idle = {str(n) for n in self.probe.zrange(self.keys.idle, 0, -1)}
            except redis.RedisError:
                idle = set()
            victims = [p for p in self._workers() if p.name in idle]
            single = [p for p in victims if p.spec is not None and p.spec.concurrency == 1]
            if single or victims:
                self._freeze(self.rng.choice(single or victims), "idle_stop")
                return
            time.sleep(0.01)

    def _freeze(self, proc: Any, kind: str) -> None:
        pause = self.settings.lease_s + self.rng.uniform(0.5, 2.0)
        proc.stopped = True
        proc.signal(signal.SIGSTOP)

        def resume() -> None:
            proc.signal(signal.SIGCONT)
            proc.stopped = False

        timer = threading.Timer(pause, resume)
        timer.start()
        self.timers.append(timer)
        if kind == "idle_stop":
            self.faults.idle_stops += 1
        else:
            self.faults.worker_stops += 1
        self.faults.note(kind, target=proc.name, pid=proc.popen.pid, pause_s=round(pause, 2))

    def handed(self, wait_s: float = HANDED_WAIT_S) -> int:
        """Wait up to ``wait_s`` for a hand-over in flight (listed in ``handed``); how many."""
        stop_at = time.monotonic() + wait_s
        n = 0
        while True:
            try:
                n = int(self.probe.zcard(self.keys.handed))
            except redis.RedisError:
                n = 0
            if n or time.monotonic() >= stop_at:
                self.faults.with_handed += n > 0
                return n
            time.sleep(0.005)

    def conn_kill(self) -> None:
        """Every client's connections closed by the server (the probe's own kept): workers'
        blocked pops, take-up and heartbeat connections, producers', reapers'."""
        handed = self.handed()
        try:
            killed = int(self.probe.execute_command("CLIENT", "KILL", "TYPE", "normal"))
        except redis.RedisError:
            return
        self.faults.conn_kills += 1
        self.faults.note("conn_kill", clients=killed, handed=handed)

    def reaper_kill(self) -> None:
        try:
            proc = self.cluster.active_reaper(self.probe, self.keys.reaper_lock)
        except redis.RedisError:
            proc = None
        proc = proc or (self.rng.choice(self.cluster.live("reaper")) if self.cluster.live("reaper") else None)
        if proc is None:
            return
        proc.signal(signal.SIGKILL)
        proc.killed = True
        proc.popen.wait(10)
        new = self.cluster.reaper(int(proc.name[len("reaper"):].split("-")[0]))
        self.faults.reaper_kills += 1
        self.faults.note("reaper_kill", target=proc.name, replacement=new.name)

    # Redis faults
    def redis_kill(self) -> None:
        """kill -9; under everysec, a host crash (the last second of writes lost)."""
        self._restart("crash" if self.settings.fsync == "everysec" else "kill")

    def redis_term(self) -> None:
        self._restart("term")

    def _restart(self, how: str) -> None:
        server = self.cluster.server
        handed = self.handed()
        down_at, down = time.time(), time.monotonic()
        cut = server.stop(how)
        time.sleep(self.rng.uniform(0.3, 1.5))  # down for a while: clients back off
        server.start()
        up = time.monotonic()
        seconds, micros = self.probe.time()
        up_ms = int(seconds) * 1000 + int(micros) // 1000
        recovery = self.recovered_after(up, up_ms)
        self.faults.redis_restarts += 1
        self.faults.redis_kills += how != "term"
        self.faults.redis_crashes += how == "crash"
        self.faults.aof_bytes_cut += cut
        self.faults.recoveries_s.append(recovery)
        self.faults.note(f"redis_{how}", down_at=down_at, down_s=round(up - down, 2),
                         recovery_s=round(recovery, 2), aof_bytes_cut=cut, handed=handed)

    def recovered_after(self, up: float, up_ms: int) -> float:
        """Seconds from ``up`` until every live, running worker heartbeat and a reaper took or
        renewed the lock after ``up_ms`` (server clock); RECOVERY_LIMIT_S if never."""
        lease_ms = int(self.settings.lease_s * 1000)
        lock_ms = int(self.settings.reaper_lock_s * 1000)
        while time.monotonic() - up < RECOVERY_LIMIT_S:
            try:
                names = [p.name for p in self._workers()]
                pipe = self.probe.pipeline(transaction=False)
                pipe.time()
                pipe.pttl(self.keys.reaper_lock)
                for name in names:
                    pipe.zscore(self.keys.workers, name)
                (seconds, micros), pttl, *scores = pipe.execute()
            except redis.RedisError:
                time.sleep(0.05)
                continue
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            beat = all(s is not None and s > up_ms + lease_ms for s in scores)
            led = pttl > lock_ms - (now_ms - up_ms)
            if beat and led:
                return time.monotonic() - up
            time.sleep(0.05)
        return RECOVERY_LIMIT_S

    def close(self) -> None:
        for timer in self.timers:
            timer.join()
        self.probe.close()
