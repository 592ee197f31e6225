"""The reaper's ``--on-scale`` command: how a GPU class's desired worker count reaches an
autoscaler that is not reading the ``scale`` hash or the exporter."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

from gpuq.errors import ConfigError

log = logging.getLogger("gpuq.reaper.scale")  # its events are the scale step's

HOOK_TIMEOUT_S = 30.0
HOOK_RETRY_S = 15.0  # a failed call is made again after this, while desired stands


class CommandHook:
    """Runs ``command class current desired`` (no shell) on a thread of its own: a slow
    command must not hold up the reaper, whose lock would lapse meanwhile. Of a class's calls
    not yet started only the latest runs (an autoscaler wants the newest count, not a replay);
    a command past its timeout is killed with its process group (a wrapper's children too,
    which would otherwise apply a stale count later); a class whose last call failed is told
    again after HOOK_RETRY_S (``due_again``)."""

    def __init__(self, command: str, timeout_s: float = HOOK_TIMEOUT_S) -> None:
        try:
            self.argv = shlex.split(command)
        except ValueError as exc:
            raise ConfigError(f"on_scale {command!r}: {exc}") from None
        if not self.argv:
            raise ConfigError("on_scale must name a command")
        self.timeout_s = timeout_s
        self.runner = ThreadPoolExecutor(1, thread_name_prefix="gpuq-scale-hook")
        self.last: Future[bool] | None = None
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[int, int, Mapping[str, str] | None]] = {}
        self._failed_at: dict[str, float] = {}  # class -> monotonic time its last call failed
        self._running: subprocess.Popen[str] | None = None  # the command now running, if any
        self._closed = False

    def __call__(self, cls: str, current: int, desired: int,
                 env: Mapping[str, str] | None = None) -> None:
        with self._lock:
            if self._closed:
                return
            queued = cls in self._pending
            self._pending[cls] = (current, desired, env)
            if not queued:
                self.last = self.runner.submit(self._run_latest, cls)

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until every call made so far has run (tests, orderly shutdown)."""
        if self.last is not None:
            self.last.result(timeout_s)

    def due_again(self, cls: str) -> bool:
        """Whether the class's last call failed at least HOOK_RETRY_S ago (then it is no
        longer counted as failed: the retry's own outcome counts)."""
        with self._lock:
            at = self._failed_at.get(cls)
            if at is None or time.monotonic() - at < HOOK_RETRY_S:
                return False
            del self._failed_at[cls]
            return True

    def close(self) -> None:
        """The reaper stops: calls not yet started are dropped and a running command is
        killed with its process group, so a slow or hung hook does not hold the exit for its
        timeout (the next active reaper tells every class afresh, ``Scaler.forget``)."""
        with self._lock:
            self._closed = True
            self._pending.clear()
            proc = self._running
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            log.warning("scale.hook_stopped pid=%d: the reaper is stopping", proc.pid)
        self.runner.shutdown(wait=False, cancel_futures=True)

    def _run_latest(self, cls: str) -> bool:
        with self._lock:
            call = self._pending.pop(cls, None)
            if call is None or self._closed:
                return False
            current, desired, env = call
        ok = self.run(cls, current, desired, env)
        with self._lock:
            if ok:
                self._failed_at.pop(cls, None)
            else:
                self._failed_at[cls] = time.monotonic()
        return ok

    def run(self, cls: str, current: int, desired: int, env: Mapping[str, str] | None = None) -> bool:
        """Run the command now (``env`` added to this process's environment); failures are
        logged, never raised."""
        argv = [*self.argv, cls, str(current), str(desired)]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True,
                                    env={**os.environ, **env} if env else None)
        except OSError as exc:
            log.warning("scale.hook_failed class=%s desired=%d error=%s", cls, desired, exc)
            return False
        with self._lock:
            self._running = proc
            closed = self._closed
        if closed:  # close() came while it started: it is not waited on either
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        try:
            _, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):  # a child that left the group
                proc.communicate(timeout=1)
            log.warning("scale.hook_failed class=%s desired=%d error=timed out after %g s "
                        "(its process group killed)", cls, desired, self.timeout_s)
            return False
        finally:
            with self._lock:
                self._running = None
        if proc.returncode != 0 and self._closed:
            return False  # killed by close(): said there
        if proc.returncode != 0:
            log.warning("scale.hook_failed class=%s desired=%d rc=%d stderr=%s", cls, desired,
                        proc.returncode, err.strip()[-500:])
        return proc.returncode == 0
