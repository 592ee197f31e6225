"""Redis Sentinel for the failover tests, and the soak both failover tests measure with.

``SentinelSet`` starts a master, one replica (``--replicaof``) and three sentinels (quorum 2)
on free loopback ports, each in its own temporary directory, waits until the sentinels agree
on the master and know the replica and each other, and stops everything at exit.

``soak`` runs producers that enqueue continuously and record the enqueues acknowledged to
them, and a worker in this process, all through clients the caller builds (Sentinel or
Cluster), kills the pool's master with ``kill -9`` mid-way, waits for the producers to be
acknowledged again, then counts the acknowledged enqueues missing from the new master.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis
import redis.sentinel

from gpuq import Config, Queue
from gpuq.app import load_app
from gpuq.embedded import EmbeddedServer, free_port, server_binary
from gpuq.errors import GpuqError
from gpuq.keys import Keys
from gpuq.scripts import ReplicaTimeout
from gpuq.worker.gpu import GpuInfo
from gpuq.worker.loop import Worker

MASTER_NAME = "gpuq-test"
DOWN_AFTER_MS = 1000  # a master silent this long is down for a sentinel
FAILOVER_TIMEOUT_MS = 3000
# a full sync starts at once (Redis waits 5 s by default for more replicas to share it)
SYNC_NOW = ["--repl-diskless-sync-delay", "0"]


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


class SentinelSet:
    """A master, one replica and three sentinels on loopback (use as a context manager)."""

    def __init__(self, sentinels: int = 3, quorum: int = 2) -> None:
        self.master = EmbeddedServer("redis", extra=SYNC_NOW)
        self.replica: EmbeddedServer | None = None
        self.count = sentinels
        self.quorum = quorum
        self.sentinel_ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.dir = ""

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", p) for p in self.sentinel_ports]

    @property
    def url(self) -> str:
        """The pool's address as gpuq's commands take it."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.addresses)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}"

    def start(self) -> SentinelSet:
        self.dir = tempfile.mkdtemp(prefix="gpuq-sentinel-")
        try:
            self.master.start()
            self.replica = EmbeddedServer(
                "redis", extra=[*SYNC_NOW, "--replicaof", "127.0.0.1", str(self.master.port)]).start()
            replica = redis.Redis(port=self.replica.port, decode_responses=True)
            wait_until(lambda: replica.info("replication")["master_link_status"] == "up", 10,
                       "the replica to sync")
            replica.close()
            for i in range(self.count):
                self._start_sentinel(i)
            wait_until(self.agreed, 15, "the sentinels to agree on the master")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_sentinel(self, i: int) -> None:
        port = free_port()
        home = Path(self.dir) / f"sentinel-{i}"
        home.mkdir()
        conf = home / "sentinel.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {home}\nlogfile {home / 'sentinel.log'}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master.port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n")
        binary = server_binary("redis")[1]
        self.procs.append(subprocess.Popen([binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True))
        self.sentinel_ports.append(port)

    def views(self) -> list[dict[str, object]]:
        """Each sentinel's view of the master (SENTINEL MASTER)."""
        out = []
        for _, port in self.addresses:
            with redis.Redis(port=port, decode_responses=True, socket_timeout=1) as s:
                out.append(s.sentinel_master(MASTER_NAME))
        return out

    def agreed(self) -> bool:
        want = str(self.master.port)
        return all(str(v["port"]) == want and v["num-slaves"] == 1
                   and v["num-other-sentinels"] == self.count - 1 for v in self.views())

    def master_address(self) -> tuple[str, int]:
        with redis.Redis(port=self.sentinel_ports[0], decode_responses=True, socket_timeout=1) as s:
            host, port = s.sentinel_get_master_addr_by_name(MASTER_NAME)
        return str(host), int(port)

    def client(self, **options: object) -> redis.Redis:
        """A client of the current master, found through the sentinels at each connect."""
        sentinel = redis.sentinel.Sentinel(self.addresses, socket_timeout=1)
        kwargs: dict[str, object] = {"decode_responses": True, "socket_timeout": None,
                                     "socket_connect_timeout": 1}
        kwargs.update(options)
        return sentinel.master_for(MASTER_NAME, **kwargs)

    def kill_master(self) -> None:
        assert self.master.proc is not None
        self.master.proc.kill()  # SIGKILL: no shutdown, no last writes flushed
        self.master.proc.wait(5)

    def restart_old_master(self) -> None:
        """Once the sentinels have promoted the replica, bring the killed master back, empty,
        on its port, as a replica of the new master (an operator's restart; the sentinels
        would convert it too, but only some seconds later). Restarted before the failover,
        it would come back an empty master."""
        assert self.replica is not None
        with redis.Redis(port=self.replica.port, decode_responses=True) as replica:
            wait_until(lambda: replica.info("replication")["role"] == "master", 30,
                       "the sentinels to promote the replica")
        self.master.stop()
        self.master.extra = [*SYNC_NOW, "--replicaof", "127.0.0.1", str(self.replica.port)]
        self.master.start()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(5)
        self.procs.clear()
        for server in (self.master, self.replica):
            if server is not None:
                server.stop()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""

    def __enter__(self) -> SentinelSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class SoakResult:
    """What one failover soak measured."""

    enqueued: int  # enqueues acknowledged to the producers
    lost: int  # of those, missing on the master after the failover
    refused: int  # enqueues that raised (not acknowledged: the producer knows)
    recovery_s: float  # from the kill to the next enqueue the new master wrote
    acked_again_s: float  # from the kill to the next acknowledged enqueue (WAIT: a replica back)
    p50_ms: float  # enqueue latency before the kill
    p99_ms: float
    worker_tasks: int  # tasks the worker ran, across the failover
    errors: dict[str, int] = field(default_factory=dict)  # refusals by exception type

    def line(self) -> str:
        return (f"enqueued={self.enqueued} lost={self.lost} refused={self.refused} "
                f"recovery_s={self.recovery_s:.2f} acked_again_s={self.acked_again_s:.2f} "
                f"p50_ms={self.p50_ms:.3f} p99_ms={self.p99_ms:.3f} "
                f"worker_tasks={self.worker_tasks} errors={self.errors}")


class Producer(threading.Thread):
    """Enqueues one task at a time until stopped; keeps the ids acknowledged and when."""

    def __init__(self, queue: Queue, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.queue = queue
        self.stop = stop
        # times are when the enqueue was sent: one acknowledged just after the kill may have
        # been written before it
        self.acked: list[tuple[float, str]] = []  # (monotonic time sent, task id)
        self.latencies: list[tuple[float, float]] = []  # (sent, seconds)
        self.errors: dict[str, int] = {}
        self.written: list[float] = []  # sent, written but not acknowledged (ReplicaTimeout)

    def run(self) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                task = self.queue.enqueue("sim.noop", model="m", vram_gb=1, priority="batch")
            except GpuqError as exc:  # a failover under way, or too few replicas
                if isinstance(exc, ReplicaTimeout):
                    self.written.append(start)
                name = type(exc).__name__
                self.errors[name] = self.errors.get(name, 0) + 1
                self.stop.wait(0.02)
                continue
            self.acked.append((start, task.id))
            self.latencies.append((start, time.monotonic() - start))


def start_worker(client: redis.Redis, config: Config, name: str) -> tuple[Worker, threading.Thread]:
    """A real gpuq worker in a thread of this process (its claim, heartbeat and ack paths)."""
    gpu = GpuInfo("sim-80GB", f"uuid-{name}", 80.0, None, "declared")
    worker = Worker(client, config, load_app("workers.sim:app"), gpu, worker_id=name)
    thread = threading.Thread(target=worker.run, name=name, daemon=True)
    thread.start()
    keys = Keys(config.pool, config.prefix)
    wait_until(lambda: client.zscore(keys.workers, name) is not None, 10, f"worker {name} to register")
    return worker, thread


def soak(connect: Callable[[], redis.Redis], config: Config, kill: Callable[[], None],
         restore: Callable[[], None], *, producers: int = 2, before_s: float = 1.5,
         after_s: float = 1.0, recover_s: float = 30.0) -> SoakResult:
    """Enqueue continuously through ``connect``'s clients, kill the master after ``before_s``;
    ``restore`` the killed node once the replica is promoted (it comes back as a replica,
    which WAIT needs); go on ``after_s`` past the first acknowledged enqueue after the kill,
    then count the acknowledged enqueues missing from the new master. A worker runs
    throughout and must run a task enqueued after the failover."""
    worker, worker_thread = start_worker(connect(), config, "w-soak")
    stop = threading.Event()
    threads = [Producer(Queue(connect(), config), stop) for _ in range(producers)]

    def first_after(killed_at: float, acked_only: bool) -> float | None:
        times = [at for t in threads for at, _ in t.acked[-50:] if at > killed_at]
        if not acked_only:
            times += [at for t in threads for at in t.written[-50:] if at > killed_at]
        return min(times) if times else None

    try:
        for t in threads:
            t.start()
        time.sleep(before_s)
        killed_at = time.monotonic()
        kill()
        restore()  # waits for the failover itself, not for the producers to notice it
        wait_until(lambda: first_after(killed_at, True), recover_s, "an acknowledged enqueue after the kill")
        time.sleep(after_s)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    written_at, acked_at = first_after(killed_at, False), first_after(killed_at, True)
    assert written_at is not None and acked_at is not None
    probe = Queue(connect(), config)
    try:
        task = probe.enqueue("sim.noop", {"probe": 1}, model="m", vram_gb=1, priority="online")
        assert task.result(timeout=20) == {"probe": 1}  # the worker runs tasks after the failover
        acked = [tid for t in threads for _, tid in t.acked]
        pipe = probe.redis.pipeline(transaction=False)
        for tid in acked:
            pipe.exists(probe.keys.task(tid))
        lost = sum(1 for found in pipe.execute() if not found)
    finally:
        worker.request_stop()
        worker_thread.join(15)
        probe.close()
    before = [s for t in threads for started, s in t.latencies if started < killed_at]
    errors: dict[str, int] = {}
    for t in threads:
        for name, n in t.errors.items():
            errors[name] = errors.get(name, 0) + n
    return SoakResult(len(acked), lost, sum(errors.values()), written_at - killed_at,
                      acked_at - killed_at, statistics.median(before) * 1000,
                      statistics.quantiles(before, n=100)[98] * 1000, worker.running.tasks_run, errors)
