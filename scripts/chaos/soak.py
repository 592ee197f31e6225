"""One soak run: start the cluster, produce under faults, drain, collect, check.

Every process and thread it starts is stopped in ``finally``, whatever ends the run (the end
of the drain, the time bound, Ctrl-C, an error of the soak itself).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from gpuq.keys import Keys

from . import collect, workload
from .checker import TERMINAL, Snapshot, check, run_counts
from .cluster import Cluster
from .faults import Faults, Injector, plan
from .observer import Observer
from .producers import Ledger, async_producer, bulk_producer, canceler, sync_producer
from .settings import Settings
from .stuck import StuckWatch

POOL = "chaos"


def say(text: str) -> None:
    print(f"chaos: {text}", file=sys.stderr, flush=True)


class Soak:
    def __init__(self, settings: Settings, run_dir: Path) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.keys = Keys(POOL)
        self.cluster = Cluster(run_dir, settings, POOL)
        self.faults = Faults()
        self.ledger = Ledger()
        self.stop = threading.Event()  # producers, canceler, injector
        self.stop_observer = threading.Event()
        self.stop_reviver = threading.Event()
        self.exits: list[tuple[str, int]] = []  # workers that exited by themselves: (name, code)
        self.threads: list[threading.Thread] = []
        self.started = time.monotonic()
        self.deadline = self.started + settings.max_minutes * 60

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def thread(self, name: str, target: Callable[..., None], *args: Any) -> threading.Thread:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        t.start()
        self.threads.append(t)
        return t

    def run(self) -> dict[str, Any]:
        try:
            return self._run()
        finally:
            self.stop.set()
            self.stop_observer.set()
            self.stop_reviver.set()
            for t in self.threads:
                t.join(10)
            self.cluster.close()

    def _run(self) -> dict[str, Any]:
        s, cluster = self.settings, self.cluster
        cluster.server.start()
        client = redis.Redis.from_url(cluster.server.url, decode_responses=True, socket_timeout=10)
        for i in range(s.reapers):
            cluster.reaper(i)
        for i, spec in enumerate(s.workers):
            cluster.worker(i, spec)
        self.wait_workers(client)
        say(f"{len(s.workers)} workers and {s.reapers} reapers up; {s.tasks} tasks over "
            f"{s.enqueue_s:g} s, appendfsync {s.fsync}")
        url, work = cluster.server.url, workload.tasks(s.tasks, s.seed)
        observer = Observer(url, self.keys, self.ledger)
        injector = Injector(cluster, s, self.keys, self.faults)
        producers = [self.thread(kind, produce, url, POOL, work[kind], self.ledger, self.stop, s.enqueue_s)
                     for kind, produce in (("sync", sync_producer), ("async", async_producer),
                                           ("bulk", bulk_producer))]
        stop_cancel = threading.Event()
        self.thread("canceler", canceler, url, POOL, self.ledger, stop_cancel, s.cancel_share, s.seed)
        self.thread("observer", observer.run, self.stop_observer)
        self.stuck = StuckWatch(url, self.keys, lambda: {p.name for p in cluster.procs if p.stopped})
        self.thread("stuck", self.stuck.run, self.stop_observer)
        faults = self.thread("faults", injector.run, plan(s, s.enqueue_s), self.stop)
        reviver = self.thread("reviver", self.revive)
        for t in [*producers, faults]:
            while t.is_alive() and self.left_s() > 0:
                t.join(10)
                self.progress(client)
        stop_cancel.set()
        self.stop.set()
        injector.close()
        self.drain(client)
        self.stop_observer.set()
        observer.sweep()
        time.sleep(3 * s.heartbeat_s + 0.5)  # idle workers show their ledger, claims go idle
        snap = self.snapshot(client, observer)
        self.stop_reviver.set()  # before the workers are stopped: they exit by themselves then
        reviver.join()
        snap.killed |= {name for name, _code in self.exits}
        after = self.shut_down(client)
        return self.figures(snap, after)

    def revive(self) -> None:
        """The workers' supervisor: replace each that exits by itself (EXIT_STUCK: a handler
        it could not stop) until the workers are stopped at the end."""
        while not self.stop_reviver.wait(0.2):
            for gone, new in self.cluster.revive():
                code = gone.popen.returncode
                self.exits.append((gone.name, code))
                self.faults.note("worker_exit", target=gone.name, code=code, replacement=new.name)
                say(f"{gone.name} exited with code {code}; {new.name} started")

    def wait_workers(self, client: redis.Redis) -> None:
        names = [p.name for p in self.cluster.live("worker")]
        stop_at = time.monotonic() + 120
        while time.monotonic() < stop_at:
            if all(client.hget(self.keys.worker(n), "state") for n in names):
                return
            time.sleep(0.1)
        raise RuntimeError(f"workers did not register within 120 s; logs in {self.run_dir / 'logs'}")

    def open_tasks(self, client: redis.Redis) -> int:
        """Acknowledged tasks stored and not ended (a task whose hash is gone will not end:
        the checker counts it lost)."""
        with self.ledger.lock:
            ids = list(self.ledger.acked)
        open_ = 0
        for i in range(0, len(ids), 1000):
            pipe = client.pipeline(transaction=False)
            for task_id in ids[i:i + 1000]:
                pipe.hget(self.keys.task(task_id), "state")
            open_ += sum(1 for state in pipe.execute() if state and state not in TERMINAL)
        return open_

    def progress(self, client: redis.Redis) -> None:
        try:
            open_ = self.open_tasks(client)
        except redis.RedisError:
            return
        f = self.faults
        say(f"{time.monotonic() - self.started:5.0f} s: {len(self.ledger.acked)} acknowledged, {open_} "
            f"not ended; kills {f.worker_kills}+{f.reaper_kills}, stops {f.worker_stops}+{f.idle_stops}, "
            f"conn kills {f.conn_kills}, "
            f"restarts {f.redis_restarts}")

    def drain(self, client: redis.Redis) -> None:
        stop_at = min(time.monotonic() + self.settings.drain_s, self.deadline - 20)
        while time.monotonic() < stop_at:
            try:
                if self.open_tasks(client) == 0:
                    return
            except redis.RedisError:
                pass
            time.sleep(0.5)
        say(f"drain ended with {self.open_tasks(client)} tasks not ended")

    def snapshot(self, client: redis.Redis, observer: Observer) -> Snapshot:
        snap = Snapshot(acked=dict(self.ledger.acked), observed=dict(observer.seen))
        with self.ledger.lock:
            snap.cancels = {**dict.fromkeys(self.ledger.cancels_unknown, "unknown"),
                            **self.ledger.canceled}
        snap.killed = {e["target"] for e in self.faults.events if e["kind"] == "worker_kill"}
        snap.stuck_seen = set(self.stuck.stuck)
        self.stuck.close()
        collect.read_tasks(client, self.keys, snap)
        collect.read_logs(self.run_dir, snap)
        collect.read_workers(client, self.keys, snap)
        collect.read_sla(client, self.keys, snap)
        live = {str(n) for n in client.zrange(self.keys.workers, 0, -1)}
        snap.leftovers = collect.leftovers(client, self.keys, live)
        observer.close()
        return snap

    def shut_down(self, client: redis.Redis) -> dict[str, int]:
        """Stop the workers cleanly, let the reapers tidy up, then count what remains."""
        for proc in self.cluster.live("worker"):
            proc.signal(15)
        for proc in self.cluster.procs:
            if proc.kind == "worker":
                proc.popen.wait(30)
        time.sleep(self.settings.lease_s + 1)
        after = collect.after_stop(client, self.keys)
        self.cluster.stop_all()
        return after

    def figures(self, snap: Snapshot, after: dict[str, int]) -> dict[str, Any]:
        f, led, s = self.faults, self.ledger, self.settings
        snap.leftovers.update(after)
        out: dict[str, Any] = {"seed": s.seed, "fsync": s.fsync, "tasks": len(led.acked),
                               "tasks_planned": s.tasks, "worker_kills": f.worker_kills,
                               "reaper_kills": f.reaper_kills, "worker_stops": f.worker_stops,
                               "idle_stops": f.idle_stops, "conn_kills": f.conn_kills,
                               "faults_with_handed": f.with_handed,
                               "redis_restarts": f.redis_restarts, "redis_kills": f.redis_kills,
                               "redis_crashes": f.redis_crashes, "aof_bytes_cut": f.aof_bytes_cut,
                               "acked_in_last_s_before_kills": self.at_risk(),
                               "longest_recovery_s": round(max(f.recoveries_s, default=0.0), 2),
                               "recoveries_s": [round(r, 2) for r in f.recoveries_s]}
        out.update(check(snap))
        out.update(run_counts(snap))
        out.update(collect.forced_stops(self.run_dir))
        out["worker_exits"] = dict(Counter(str(code) for _name, code in self.exits))
        out.update({"enqueue_retries": sum(led.errors.values()), "enqueue_errors": dict(led.errors),
                    "enqueue_retries_found_written": led.duplicate_retries,
                    "enqueue_first_try_duplicates": led.duplicate_first_tries,
                    "enqueues_given_up": len(led.given_up), "canceled": len(led.canceled),
                    "states": collect.summary_states(snap), "leftovers": snap.leftovers,
                    "wall_s": round(time.monotonic() - self.started, 1)})
        out["lost_detail"] = self.lost_detail(snap)
        collect.dump(snap, self.run_dir / "snapshot.json")
        return out

    def at_risk(self) -> int:
        """Enqueues acknowledged within the second before a kill -9 or crash of Redis: what
        everysec may lose to a host crash at that moment."""
        kills = [e["down_at"] for e in self.faults.events if e["kind"] in ("redis_kill", "redis_crash")]
        return sum(1 for at in self.ledger.acked_at.values() if any(0 <= k - at <= 1.0 for k in kills))

    def lost_detail(self, snap: Snapshot) -> list[dict[str, Any]]:
        """For each lost enqueue: how long before the nearest Redis kill it was acknowledged
        (what appendfsync everysec may lose)."""
        kills = [e["down_at"] for e in self.faults.events if e["kind"] in ("redis_kill", "redis_crash")]
        out = []
        for task_id in [t for t in snap.acked if snap.tasks.get(t, {}).get("state") not in TERMINAL][:20]:
            at = self.ledger.acked_at[task_id]
            before = [k - at for k in kills if k >= at]
            out.append({"task": task_id, "state": snap.tasks[task_id].get("state", "missing"),
                        "acked_s_before_kill": round(min(before), 3) if before else None})
        return out
