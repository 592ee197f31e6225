"""The soak's sizes and the settings its processes run with (quick for CI, full by hand)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkerSpec:
    vram_gb: float
    gpu: str
    concurrency: int


# mixed VRAM and concurrency; only the 48 and 80 GB cards fit the largest model's tasks
# (enqueue hands a task over only to an idle worker of concurrency 1: two of them)
WORKERS = (WorkerSpec(24, "L4", 1), WorkerSpec(24, "L4", 2), WorkerSpec(48, "L40S", 2),
           WorkerSpec(48, "L40S", 3), WorkerSpec(80, "A100", 2), WorkerSpec(80, "H100", 4),
           WorkerSpec(48, "L40S", 1))

# short leases and a fast reaper, so faults are seen and recovered from within seconds
PROCESS_ENV = {
    "GPUQ_LEASE_S": "3",
    "GPUQ_HEARTBEAT_S": "0.5",
    "GPUQ_SHUTDOWN_GRACE_S": "5",
    "GPUQ_STOP_S": "1",  # a stopped handler still running this long: the worker exits EXIT_STUCK
    "GPUQ_IDLE_BLOCK_S": "1",
    "GPUQ_IDLE_TIMEOUT_S": "0",  # no retirement: the soak keeps its pool
    "GPUQ_RETRY_BASE_S": "0.2",
    "GPUQ_RETRY_MAX_S": "1",
    "GPUQ_REAP_INTERVAL_S": "0.2",
    "GPUQ_REAPER_LOCK_S": "2",
    "GPUQ_HOLDER_WAIT_S": "2",
    "GPUQ_DEFER_S": "1",
    "GPUQ_GRACE_S": "2",
    "GPUQ_MAX_WAIT_S": "1",
    "GPUQ_PREEMPT_MIN_RUNTIME_S": "0.3",
    "GPUQ_LOG_LEVEL": "INFO",
}


@dataclass(frozen=True)
class Settings:
    tasks: int = 10_000
    seed: int = 1
    fsync: str = "always"  # the server's appendfsync
    enqueue_s: float = 600.0  # producers spread their tasks over this long
    drain_s: float = 300.0  # after the producers, longest wait for every task to end
    max_minutes: float = 30.0  # hard bound on the whole run
    # faults, spread over the enqueue window (at least these many of each)
    redis_restarts: int = 4  # half of them by kill -9, the first one among them
    reaper_kills: int = 8
    worker_kills: int = 30
    worker_stops: int = 20
    idle_stops: int = 20  # an idle worker frozen, so hand-overs land on it
    conn_kills: int = 10  # CLIENT KILL TYPE normal while a hand-over is in flight
    workers: tuple[WorkerSpec, ...] = WORKERS
    reapers: int = 2
    cancel_share: float = 0.05
    env: dict[str, str] = field(default_factory=lambda: dict(PROCESS_ENV))

    @property
    def lease_s(self) -> float:
        return float(self.env["GPUQ_LEASE_S"])

    @property
    def heartbeat_s(self) -> float:
        return float(self.env["GPUQ_HEARTBEAT_S"])

    @property
    def reaper_lock_s(self) -> float:
        return float(self.env["GPUQ_REAPER_LOCK_S"])


FULL = Settings()
QUICK = Settings(tasks=1000, enqueue_s=60.0, drain_s=60.0, max_minutes=3.0, redis_restarts=2,
                 reaper_kills=2, worker_kills=4, worker_stops=3, idle_stops=3, conn_kills=3)
