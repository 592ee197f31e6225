"""Real gpuq processes for the integration tests: workers, reapers and CLI calls.

Each process runs ``python -m gpuq --redis URL --pool POOL ...`` against the suite's Redis
server with short leases and a scaled-down simulated clock (``FAST_ENV``), logs to a file
under the test's tmp_path (shown when a wait fails), and is killed at teardown if it is still
alive. Waits poll a condition with a deadline; nothing sleeps blindly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any, TypeVar

import redis

from gpuq.keys import Keys
from gpuq.task import State, TaskRecord
from gpuq.worker.takeup import handed_over

ROOT = Path(__file__).resolve().parent.parent
SIM_APP = "workers.sim:app"
SCALE = 0.1  # GPUQ_SIM_TIME_SCALE: a default model load takes 0.1 s, est_s=1 runs 0.1 s

FAST_ENV = {
    "GPUQ_SIM_TIME_SCALE": str(SCALE),
    "GPUQ_LEASE_S": "2",
    "GPUQ_HEARTBEAT_S": "0.5",
    "GPUQ_SHUTDOWN_GRACE_S": "5",
    "GPUQ_IDLE_BLOCK_S": "1",
    "GPUQ_RETRY_BASE_S": "0.2",
    "GPUQ_RETRY_MAX_S": "1",
    "GPUQ_REAP_INTERVAL_S": "0.2",
    "GPUQ_REAPER_LOCK_S": "2",
    "GPUQ_LOG_LEVEL": "INFO",
}

T = TypeVar("T")


def est(seconds: float) -> float:
    """The est_s that makes sim.run work for ``seconds`` of wall time under SCALE."""
    return seconds / SCALE


def wait_for(condition: Callable[[], T | None], timeout: float = 10.0, interval: float = 0.02,
             message: str | Callable[[], str] = "condition") -> T:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout:g} s waiting for {text}")
        time.sleep(interval)


class Proc:
    """One gpuq process; its stdout and stderr go to a log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.args = args
        self.log_path = log_path
        self._log: IO[bytes] | None = open(log_path, "wb")
        self.popen = subprocess.Popen(args, env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                      stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def wait(self, timeout: float = 20.0) -> int:
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not exit within {timeout:g} s; log:\n"
                                 f"{self.log()[-4000:]}") from None
        self._close_log()
        return code

    def stop(self) -> None:
        """Teardown: kill if still running, reap the process, close the log."""
        if self.alive():
            self.kill()
        try:
            self.popen.wait(10)
        finally:
            self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class Procs:
    """Starts gpuq processes for one pool and cleans them up (use as a context manager)."""

    def __init__(self, url: str, pool: str, prefix: str, tmp_path: Path, **env: str) -> None:
        self.url = url
        self.pool = pool
        self.prefix = prefix
        self.keys = Keys(pool, prefix)
        self.tmp_path = tmp_path
        self.env_overrides = {**FAST_ENV, **env}
        self.procs: list[Proc] = []
        self.redis = redis.Redis.from_url(url, decode_responses=True)
        self._count = 0

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        errors = []
        for proc in self.procs:
            try:
                proc.stop()
            except Exception as exc:  # keep stopping the others
                errors.append(exc)
        self.procs.clear()
        self.redis.close()
        if errors:
            raise errors[0]

    # starting processes
    def environment(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
        env.update(self.env_overrides)
        env.update(extra or {})
        env["GPUQ_PREFIX"] = self.prefix
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def base_args(self) -> list[str]:
        return [sys.executable, "-m", "gpuq", "--redis", self.url, "--pool", self.pool]

    def start(self, name: str, args: Iterable[str], env: dict[str, str] | None = None) -> Proc:
        self._count += 1
        log_path = self.tmp_path / f"{self._count:02d}-{name}.log"
        proc = Proc(name, [*self.base_args(), *args], self.environment(env), log_path)
        self.procs.append(proc)
        return proc

    def worker(self, name: str, *, vram_gb: float = 80, gpu_name: str | None = None,
               concurrency: int | None = None, burst: bool = False,
               env: dict[str, str] | None = None, wait: bool = True,
               timeout: float = 15.0, gpu_count: int = 1) -> Proc:
        """Start a worker on a declared (simulated) GPU, or a group of ``gpu_count`` of them;
        by default wait until it registered."""
        args = ["worker", "--app", SIM_APP, "--vram-gb", f"{vram_gb:g}",
                "--gpu-name", gpu_name or f"sim-{vram_gb:g}GB", "--name", name]
        if gpu_count != 1:
            args += ["--gpu-count", str(gpu_count)]
        if concurrency is not None:
            args += ["--concurrency", str(concurrency)]
        if burst:
            args.append("--burst")
        proc = self.start(name, args, env)
        if wait:
            self.wait_registered(proc, timeout)
        return proc

    def reaper(self, *, env: dict[str, str] | None = None) -> Proc:
        return self.start("reaper", ["reaper"], env)

    def cli(self, *args: str, env: dict[str, str] | None = None,
            timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run one CLI command to completion; output captured (pipes closed on return)."""
        return subprocess.run([*self.base_args(), *args], env=self.environment(env), cwd=ROOT,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def run_cli(self, *args: str) -> str:
        """One CLI command in this process (CliRunner): no interpreter start-up, so it lands
        while a short task still runs. Returns stdout; a non-zero exit fails the test."""
        from click.testing import CliRunner

        from gpuq.cli import cli

        result = CliRunner().invoke(cli, ["--redis", self.url, "--pool", self.pool, *args],
                                    env={"GPUQ_PREFIX": self.prefix})
        assert result.exit_code == 0, result.output
        return result.stdout

    # waiting on the pool
    def registered(self, worker_id: str) -> bool:
        return self.redis.zscore(self.keys.workers, worker_id) is not None

    def wait_registered(self, proc: Proc, timeout: float = 15.0) -> None:
        def ready() -> bool:
            if not proc.alive():
                raise AssertionError(f"worker {proc.name} exited with {proc.popen.returncode} "
                                     f"before registering; log:\n{proc.log()[-4000:]}")
            # registered, and its first heartbeat wrote the worker hash's "state"
            return self.registered(proc.name) and bool(self.redis.hget(self.keys.worker(proc.name), "state"))

        wait_for(ready, timeout, message=lambda: f"worker {proc.name} to register; log:\n"
                 f"{proc.log()[-4000:]}")

    def record(self, task_id: str) -> TaskRecord:
        fields = self.redis.hgetall(self.keys.task(task_id))
        assert fields, f"task {task_id} not found"
        return TaskRecord.from_fields(fields)

    def records(self, task_ids: list[str]) -> list[TaskRecord]:
        pipe = self.redis.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hgetall(self.keys.task(task_id))
        return [TaskRecord.from_fields(f) for f in pipe.execute()]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.log()[-3000:]}" for p in self.procs)

    def wait_state(self, task_id: str, *states: State | str, timeout: float = 15.0) -> TaskRecord:
        wanted = {State(s) for s in states}

        def reached() -> TaskRecord | None:
            record = self.record(task_id)
            return record if record.state in wanted and self.picked_up(record) else None

        return wait_for(reached, timeout, message=lambda: (
            f"task {task_id} to reach {sorted(s.value for s in wanted)} "
            f"(it is {self.record(task_id).state.value}); logs:\n{self.logs()}"))

    def wait_all(self, task_ids: list[str], *states: State | str,
                 timeout: float = 30.0) -> list[TaskRecord]:
        wanted = {State(s) for s in states}

        def reached() -> list[TaskRecord] | None:
            records = self.records(task_ids)
            return records if all(r.state in wanted for r in records) else None

        def why() -> str:
            counts: dict[str, int] = {}
            for r in self.records(task_ids):
                counts[r.state.value] = counts.get(r.state.value, 0) + 1
            return f"{len(task_ids)} tasks to reach {sorted(s.value for s in wanted)}: {counts}; " \
                   f"logs:\n{self.logs()}"

        return wait_for(reached, timeout, interval=0.05, message=why)

    def wait_running_on(self, task_id: str, worker_id: str, timeout: float = 15.0) -> TaskRecord:
        """Wait until the task runs under ``worker_id`` (a new attempt after a takeover)."""
        def running() -> TaskRecord | None:
            record = self.record(task_id)
            ok = record.state is State.RUNNING and record.worker == worker_id
            return record if ok and self.picked_up(record) else None

        return wait_for(running, timeout, message=lambda: (
            f"{worker_id} to run task {task_id}; logs:\n{self.logs()}"))

    def picked_up(self, record: TaskRecord) -> bool:
        """A running task handed over at enqueue counts as running once its worker has taken
        it up (it left `handed`): until then a claim or a reap round may take it back."""
        if record.state is not State.RUNNING:
            return True
        unread = filter(None, map(handed_over, self.redis.lrange(self.keys.wake(record.worker), 0, -1)))
        return (all(fields["id"] != record.id for fields in unread)
                and self.redis.zscore(self.keys.handed, record.id) is None)

    def wait_idle(self, worker_id: str, timeout: float = 15.0) -> None:
        """Wait until the worker found nothing to claim and blocks for work."""
        wait_for(lambda: self.redis.zscore(self.keys.idle, worker_id) is not None, timeout,
                 message=lambda: f"{worker_id} to go idle; logs:\n{self.logs()}")

    def server_ms(self) -> int:
        seconds, micros = self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def status(self) -> dict[str, Any]:
        """``gpuq status --json`` as a subprocess, parsed."""
        import json

        out = self.cli("status", "--json")
        assert out.returncode == 0, out.stderr
        data: dict[str, Any] = json.loads(out.stdout)
        return data
